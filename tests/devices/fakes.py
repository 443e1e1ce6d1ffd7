"""Small fake NVIDIA libraries, built with ``cc`` for a test: a ``libcuda.so.1`` and a ``libnvidia-ml.so.1``.

The fake driver answers ``cuDeviceGetCount`` as the real one does (CUDA_ERROR_NOT_INITIALIZED
until ``cuInit`` ran) and appends the pid of every process that called ``cuInit`` to
``$FAKE_CUDA_RECORD``. The fake NVML lists the GPUs that ``$FAKE_NVML_GPUS`` describes
(``name|uuid|major|minor|mig-uuid,mig-uuid;...``) and ``$FAKE_NVML_DRIVER`` as its driver version.

Example::

    library = build_fake_cuda(tmp_path)   # tmp_path/libcuda.so.1
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

FAKE_CUDA = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static int initialised = 0;
int cuInit(unsigned int flags) {
    const char *path = getenv("FAKE_CUDA_RECORD");
    initialised = 1;
    if (path) { FILE *f = fopen(path, "a"); if (f) { fprintf(f, "%d\n", (int)getpid()); fclose(f); } }
    return 0;
}
int cuDeviceGetCount(int *count) {
    const char *n = getenv("FAKE_CUDA_DEVICES");
    if (!initialised) return 3; /* CUDA_ERROR_NOT_INITIALIZED */
    *count = n ? atoi(n) : 1;
    return 0;
}
"""

FAKE_NVML = r"""
#include <stdlib.h>
#include <string.h>
#define MAX_GPUS 8
#define MAX_MIGS 7
typedef struct { char name[96], uuid[96]; int major, minor, migs; char mig[MAX_MIGS][96]; } gpu_t;
static gpu_t gpus[MAX_GPUS];
static int count = -1;
static void field(char *dst, const char *src) { strncpy(dst, src ? src : "", 95); dst[95] = 0; }
int nvmlInit_v2(void) {
    char spec[4096], *save_gpu = 0, *one;
    const char *env = getenv("FAKE_NVML_GPUS");
    count = 0;
    if (!env) return 0;
    strncpy(spec, env, sizeof spec - 1); spec[sizeof spec - 1] = 0;
    for (one = strtok_r(spec, ";", &save_gpu); one && count < MAX_GPUS; one = strtok_r(0, ";", &save_gpu)) {
        gpu_t *g = &gpus[count++];
        char *parts[5] = {0}, *p = one; int i;
        for (i = 0; i < 5; i++) { parts[i] = p; p = p ? strchr(p, '|') : 0; if (p) *p++ = 0; }
        field(g->name, parts[0]); field(g->uuid, parts[1]);
        g->major = parts[2] ? atoi(parts[2]) : 0; g->minor = parts[3] ? atoi(parts[3]) : 0; g->migs = 0;
        if (parts[4] && *parts[4]) {
            char *save_mig = 0, *m;
            for (m = strtok_r(parts[4], ",", &save_mig); m && g->migs < MAX_MIGS; m = strtok_r(0, ",", &save_mig)) field(g->mig[g->migs++], m);
        }
    }
    return 0;
}
/* A handle is 1 + gpu index, or 1000 * (1 + gpu) + 1 + slot for a MIG instance. */
int nvmlDeviceGetCount_v2(unsigned int *n) { if (count < 0) return 1; *n = count; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { if ((int)i >= count) return 2; *h = (void *)(long)(i + 1); return 0; }
static int copy(char *out, unsigned int len, const char *text) { if (strlen(text) + 1 > len) return 7; strcpy(out, text); return 0; }
int nvmlDeviceGetUUID(void *h, char *out, unsigned int len) {
    long v = (long)h;
    if (v >= 1000) return copy(out, len, gpus[v / 1000 - 1].mig[v % 1000 - 1]);
    return copy(out, len, gpus[v - 1].uuid);
}
int nvmlDeviceGetName(void *h, char *out, unsigned int len) { return copy(out, len, gpus[(long)h - 1].name); }
int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) { *major = gpus[(long)h - 1].major; *minor = gpus[(long)h - 1].minor; return 0; }
int nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned int *n) { *n = gpus[(long)h - 1].migs ? MAX_MIGS : 0; return 0; }
int nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned int slot, void **mig) {
    long v = (long)h;
    if ((int)slot >= gpus[v - 1].migs) return 6; /* NVML_ERROR_NOT_FOUND: an empty slot */
    *mig = (void *)(1000 * v + 1 + slot);
    return 0;
}
int nvmlSystemGetDriverVersion(char *out, unsigned int len) { const char *v = getenv("FAKE_NVML_DRIVER"); return copy(out, len, v ? v : "550.54.15"); }
"""


def _build(source: str, folder: Path, name: str) -> Path:
    if shutil.which("cc") is None:
        pytest.fail("cc is needed to build the fake NVIDIA libraries (apt-get install gcc)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.c").write_text(source)
    library = folder / name
    subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{name}", "-o", str(library), str(folder / f"{name}.c")], check=True, timeout=60)
    return library


def build_fake_cuda(folder: Path) -> Path:
    """``folder/libcuda.so.1``: records cuInit, answers cuDeviceGetCount like the real driver."""
    return _build(FAKE_CUDA, folder, "libcuda.so.1")


def build_fake_nvml(folder: Path) -> Path:
    """``folder/libnvidia-ml.so.1``: the GPUs ``$FAKE_NVML_GPUS`` describes."""
    return _build(FAKE_NVML, folder, "libnvidia-ml.so.1")
