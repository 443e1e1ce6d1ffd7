"""Small fake NVIDIA libraries, built with ``cc`` for a test: a ``libcuda.so.1`` and a ``libnvidia-ml.so.1``.

The fake driver answers ``cuDeviceGetCount`` as the real one does (CUDA_ERROR_NOT_INITIALIZED
until ``cuInit`` ran) and appends the pid of every process that called ``cuInit`` to
``$FAKE_CUDA_RECORD``. The fake NVML lists the GPUs that ``$FAKE_NVML_GPUS`` describes
(``name|uuid|major|minor|mig-uuid,mig-uuid;...``) and ``$FAKE_NVML_DRIVER`` as its driver version,
and answers per-process memory and utilisation from the file ``$FAKE_NVML_USE`` names (``write_use``).

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
static int count_or_zero(void) { return count < 0 ? 0 : count; }
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

/* Per-process memory and utilisation, read from $FAKE_NVML_USE at every call (a test rewrites it
   meanwhile): lines "proc <gpu> <pid> <bytes>" ("na" bytes: NVML_VALUE_NOT_AVAILABLE) and
   "util <gpu> <percent>". Every call appends its name and GPU to $FAKE_NVML_CALLS, if set. */
#include <stdio.h>
#define MAX_PROCS 256
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_v2_t;
/* What _v3 fills from driver R535 on (the same name, a longer record): v2's plus usedGpuCcProtectedMemory. */
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; unsigned long long cc; } proc_v3_t;
static int driver_major(void) { const char *v = getenv("FAKE_NVML_DRIVER"); return atoi(v ? v : "550"); }
typedef struct { unsigned int pid; unsigned long long used; } proc_v1_t;
static void note(const char *call, long gpu) {
    const char *path = getenv("FAKE_NVML_CALLS"); FILE *f;
    if (path && (f = fopen(path, "a"))) { fprintf(f, "%s %ld\n", call, gpu); fclose(f); }
}
static int read_use(long gpu, unsigned int *pids, unsigned long long *used, int *util) {
    const char *path = getenv("FAKE_NVML_USE"); FILE *f; char kind[8], bytes[32]; long g; unsigned int pid; int n = 0, pct;
    *util = -1;
    if (!path || !(f = fopen(path, "r"))) return 0;
    while (fscanf(f, "%7s", kind) == 1) {
        if (!strcmp(kind, "proc") && fscanf(f, "%ld %u %31s", &g, &pid, bytes) == 3) {
            if (g == gpu && n < MAX_PROCS) { pids[n] = pid; used[n++] = strcmp(bytes, "na") ? strtoull(bytes, 0, 10) : ~0ULL; }
        } else if (!strcmp(kind, "util") && fscanf(f, "%ld %d", &g, &pct) == 2) {
            if (g == gpu) *util = pct;
        } else if (!strcmp(kind, "mem") && fscanf(f, "%ld %31s %*s", &g, bytes) == 2) {
            /* read by nvmlDeviceGetMemoryInfo */
        } else break;
    }
    fclose(f);
    return n;
}
static int list(const char *call, void *h, unsigned int *count, void *infos, int v1) {
    int v3 = !strcmp(call, "v3") && driver_major() >= 535;
    unsigned int pids[MAX_PROCS]; unsigned long long used[MAX_PROCS]; int util, n, i; long v = (long)h;
    if (v < 1 || v > count_or_zero()) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    note(call, v - 1);
    n = read_use(v - 1, pids, used, &util);
    if ((int)*count < n) { *count = n; return 7; } /* NVML_ERROR_INSUFFICIENT_SIZE */
    for (i = 0; i < n; i++) {
        if (v1) { proc_v1_t *p = (proc_v1_t *)infos + i; p->pid = pids[i]; p->used = used[i]; }
        else if (v3) { proc_v3_t *p = (proc_v3_t *)infos + i; p->pid = pids[i]; p->used = used[i]; p->gi = p->ci = ~0U; p->cc = 0; }
        else { proc_v2_t *p = (proc_v2_t *)infos + i; p->pid = pids[i]; p->used = used[i]; p->gi = p->ci = ~0U; }
    }
    *count = n;
    return 0;
}
#ifndef NO_V3
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *n, void *infos) { return list("v3", h, n, infos, 0); }
#endif
#ifndef NO_V2
int nvmlDeviceGetComputeRunningProcesses_v2(void *h, unsigned int *n, void *infos) { return list("v2", h, n, infos, 0); }
#endif
int nvmlDeviceGetComputeRunningProcesses(void *h, unsigned int *n, void *infos) { return list("v1", h, n, infos, 1); }
/* "mem <gpu> <used> <total>" lines: the device's memory in use by every process (no line: 0 of 80 GiB). */
int nvmlDeviceGetMemoryInfo(void *h, unsigned long long *info) {
    const char *path = getenv("FAKE_NVML_USE"); FILE *f; char kind[8]; long g, v = (long)h; unsigned long long used, total;
    if (v < 1 || v > count_or_zero()) return 2;
    info[0] = 80ULL << 30; info[1] = info[0]; info[2] = 0; /* total, free, used */
    if (!path || !(f = fopen(path, "r"))) return 0;
    while (fscanf(f, "%7s", kind) == 1) {
        if (!strcmp(kind, "mem")) {
            if (fscanf(f, "%ld %llu %llu", &g, &used, &total) != 3) break;
            if (g == v - 1) { info[0] = total; info[2] = used; info[1] = total - used; }
        } else { int c; while ((c = fgetc(f)) != EOF && c != '\n'); }
    }
    fclose(f);
    return 0;
}
int nvmlSystemGetCudaDriverVersion_v2(int *version) { const char *v = getenv("FAKE_NVML_CUDA"); *version = atoi(v ? v : "12080"); return 0; }
int nvmlDeviceGetUtilizationRates(void *h, unsigned int *rates) {
    unsigned int pids[MAX_PROCS]; unsigned long long used[MAX_PROCS]; int util; long v = (long)h;
    if (v < 1 || v > count_or_zero()) return 2;
    note("util", v - 1);
    read_use(v - 1, pids, used, &util);
    if (util < 0) return 3; /* NVML_ERROR_NOT_SUPPORTED, as on a MIG instance */
    rates[0] = util; rates[1] = 0;
    return 0;
}
"""


def _build(source: str, folder: Path, name: str, defines: tuple[str, ...] = ()) -> Path:
    if shutil.which("cc") is None:
        pytest.fail("cc is needed to build the fake NVIDIA libraries (apt-get install gcc)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.c").write_text(source)
    library = folder / name
    flags = [f"-D{define}" for define in defines]
    subprocess.run(["cc", "-shared", "-fPIC", *flags, f"-Wl,-soname,{name}", "-o", str(library), str(folder / f"{name}.c")], check=True, timeout=60)
    return library


def build_fake_cuda(folder: Path) -> Path:
    """``folder/libcuda.so.1``: records cuInit, answers cuDeviceGetCount like the real driver."""
    return _build(FAKE_CUDA, folder, "libcuda.so.1")


def build_fake_nvml(folder: Path, process_calls: tuple[str, ...] = ("v3", "v2", "v1")) -> Path:
    """``folder/libnvidia-ml.so.1``: the GPUs ``$FAKE_NVML_GPUS`` describes, each process's memory
    and each GPU's utilisation as ``$FAKE_NVML_USE`` says; ``process_calls`` are the versions of
    ``nvmlDeviceGetComputeRunningProcesses`` it exports (an older driver's lack ``v3``, ``v2``)."""
    defines = tuple(f"NO_{version.upper()}" for version in ("v3", "v2") if version not in process_calls)
    return _build(FAKE_NVML, folder, "libnvidia-ml.so.1", defines)


def write_use(path: Path, processes: dict[int, dict[int, int | None]], utilisation: dict[int, int], memory: dict[int, tuple[int, int]] | None = None) -> None:
    """Tell the fake NVML (``$FAKE_NVML_USE``) what runs: gpu -> {pid: bytes (None: not available)}, gpu -> percent,
    gpu -> (bytes used by every process, total bytes) (default 0 of 80 GiB).

    Written whole and renamed into place, so the fake never reads half a file.
    """
    lines = [f"proc {gpu} {pid} {'na' if used is None else used}" for gpu, found in processes.items() for pid, used in found.items()]
    lines += [f"util {gpu} {percent}" for gpu, percent in utilisation.items()]
    lines += [f"mem {gpu} {used} {total}" for gpu, (used, total) in (memory or {}).items()]
    scratch = path.with_suffix(".new")
    scratch.write_text("\n".join(lines) + "\n")
    scratch.replace(path)


def fake_kfd_tree(root: Path, gpus: list[dict[str, int | str]], cpus: int = 1) -> Path:
    """A stand-in for ``/sys/class/kfd`` (and each GPU's ``/sys/class/drm/renderD<N>/device``) under ``root``.

    KFD lists CPU nodes first (``gpu_id`` 0), then one node per GPU: each dict gives ``gpu_id``,
    ``name`` (ISA), ``unique_id``, ``minor`` (render node), ``total``/``used`` (VRAM bytes), ``busy`` (%).
    Also creates ``root/dev/kfd`` (a plain file: opening it stands for ROCr's open).
    """
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    for node in range(cpus):
        (nodes / str(node)).mkdir(parents=True, exist_ok=True)
        (nodes / str(node) / "gpu_id").write_text("0\n")
        (nodes / str(node) / "name").write_text("\n")
        (nodes / str(node) / "properties").write_text("cpu_cores_count 16\nsimd_count 0\n")
    for offset, gpu in enumerate(gpus):
        folder = nodes / str(cpus + offset)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "gpu_id").write_text(f"{gpu['gpu_id']}\n")
        (folder / "name").write_text(f"{gpu.get('name', 'gfx942')}\n")
        (folder / "properties").write_text(f"cpu_cores_count 0\nsimd_count 1216\nunique_id {gpu.get('unique_id', 0)}\ndrm_render_minor {gpu['minor']}\n")
        device = root / f"sys/class/drm/renderD{gpu['minor']}/device"
        device.mkdir(parents=True, exist_ok=True)
        (device / "vendor").write_text("0x1002\n")
        (device / "class").write_text("0x038000\n")
        (device / "mem_info_vram_total").write_text(f"{gpu.get('total', 192 * 2**30)}\n")
        (device / "mem_info_vram_used").write_text(f"{gpu.get('used', 0)}\n")
        (device / "gpu_busy_percent").write_text(f"{gpu.get('busy', 0)}\n")
    (root / "sys/class/kfd/kfd/proc").mkdir(parents=True, exist_ok=True)
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev/kfd").touch()
    return root


def write_kfd_process(root: Path, pid: int, vram: dict[int, int]) -> None:
    """KFD's ``proc/<pid>/vram_<gpu_id>`` files: what ``pid`` holds on each GPU (by gpu_id)."""
    folder = root / "sys/class/kfd/kfd/proc" / str(pid)
    folder.mkdir(parents=True, exist_ok=True)
    for gpu_id, size in vram.items():
        (folder / f"vram_{gpu_id}").write_text(f"{size}\n")


def fake_drm_tree(root: Path, cards: list[tuple[str, int, int, str]]) -> Path:
    """A stand-in for ``/sys/class/drm`` and ``/dev/dri`` under ``root``: (pci address, vendor, class, render node) each."""
    for address, vendor, klass, node in cards:
        pci = root / "sys/devices/pci0000:00" / address
        pci.mkdir(parents=True, exist_ok=True)
        (pci / "vendor").write_text(f"{vendor:#06x}\n")
        (pci / "class").write_text(f"{klass:#08x}\n")
        (pci / "device").write_text("0x0bd5\n")
        render = root / "sys/class/drm" / node
        render.mkdir(parents=True, exist_ok=True)
        (render / "device").symlink_to(pci)
        (root / "dev/dri").mkdir(parents=True, exist_ok=True)
        (root / "dev/dri" / node).touch()
    return root
