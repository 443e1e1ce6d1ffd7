"""Lightning, written for torchrun, runs unchanged in ranks launched from a real kernel (issue 16).

Before nbaccel's ranks looked like torchrun's, ``Fabric(strategy="ddp")`` and ``Trainer(strategy=
"ddp")`` refused on every rank ("not compatible with an interactive environment": the kernel's
``sys.ps1``, and Lightning's ``_IS_INTERACTIVE`` frozen when the notebook imported lightning).
Each launch here trains the same tiny model as the same code under ``torchrun --nproc-per-node 2``
(the venv's), and the final parameters must be equal.

Lightning's import costs ~10 s per process on a loaded CI machine: the torchrun reference runs once
per module, the first kernel launch imports it in each rank, the later ones after the notebook did.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nbaccel.testing import scaled
from tests.kernel_harness import Kernel

# Found, not imported: importing lightning imports matplotlib.pyplot (Agg) into the test process,
# and every rank forked later would inherit that backend instead of the one its test sets.
if importlib.util.find_spec("lightning") is None:
    pytest.skip("lightning is not installed (the test extra has it)", allow_module_level=True)

pytestmark = [pytest.mark.kernel, pytest.mark.slow, pytest.mark.timeout(300)]

TORCHRUN = Path(sys.executable).with_name("torchrun")

# The same source in the notebook and in the torchrun script.
TRAIN = """
def fabric_train():
    import torch, lightning
    fabric = lightning.Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(0, verbose=False)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    data = torch.Generator().manual_seed(100 + fabric.global_rank)  # each rank its own batches
    for _ in range(3):
        loss = model(torch.randn(8, 4, generator=data)).pow(2).mean()
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
    return [p.detach().tolist() for p in model.parameters()]


def trainer_train(root):
    import torch, lightning

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, index):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    lightning.seed_everything(0, verbose=False)
    model = Tiny()
    data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=torch.Generator().manual_seed(1)))
    trainer = lightning.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, default_root_dir=root,
        enable_progress_bar=False, logger=False, enable_checkpointing=False, enable_model_summary=False,
    )
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
    return [p.detach().tolist() for p in model.parameters()]
"""

UNDER_TORCHRUN = (
    TRAIN
    + """
import json, os, sys
fabric, trainer = fabric_train(), trainer_train(sys.argv[1])
if os.environ["RANK"] == "0":
    with open(os.path.join(sys.argv[1], "params.json"), "w") as out:
        json.dump({"fabric": fabric, "trainer": trainer}, out)
"""
)


@pytest.fixture(scope="module")
def under_torchrun(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("torchrun")
    script = folder / "train.py"
    script.write_text(UNDER_TORCHRUN)
    done = subprocess.run([str(TORCHRUN), "--nproc-per-node", "2", str(script), str(folder)], check=False, capture_output=True, text=True, timeout=scaled(240))
    assert done.returncode == 0, done.stderr[-3000:]
    params: dict[str, Any] = json.loads((folder / "params.json").read_text())
    return params


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return "import nbaccel, json, sys, tempfile\n%load_ext nbaccel\n" + TRAIN


def _value(kernel: Kernel, expression: str) -> Any:
    run = kernel.execute(f"print(json.dumps({expression}))")
    assert run.status == "ok", run.error
    return json.loads(run.stdout)


def _close(ours: Any, theirs: Any) -> bool:
    """The same parameters, to the last bit (same seeds, same data, same gloo all-reduces)."""
    return bool(ours == theirs)


def test_fabric_under_notebook_launcher_trains_as_under_torchrun(kernel: Kernel, under_torchrun: dict[str, Any]) -> None:
    assert _value(kernel, "'lightning' in sys.modules") is False  # each rank imports it itself
    run = kernel.execute("fabric = nbaccel.notebook_launcher(fabric_train, num_processes=2, timeout=200)", timeout=scaled(240))
    assert run.status == "ok", (run.error, run.stdout[-3000:])
    fabric = _value(kernel, "fabric")
    assert fabric[0] == fabric[1] and _close(fabric[0], under_torchrun["fabric"])
    assert kernel.children() == []


def test_after_the_notebook_imported_lightning_trainer_in_a_cell_trains_as_under_torchrun(kernel: Kernel, under_torchrun: dict[str, Any]) -> None:
    assert kernel.execute("import lightning; root = tempfile.mkdtemp()").status == "ok"
    assert _value(kernel, "lightning.fabric.utilities.imports._IS_INTERACTIVE") is True  # the kernel's own answer
    run = kernel.execute("%%distributed -n 2 -o trained\ntrainer_train(root)", timeout=scaled(180))
    assert run.status == "ok", (run.error, run.stdout[-3000:])
    trained = _value(kernel, "trained")
    assert trained[0] == trained[1] and _close(trained[0], under_torchrun["trainer"])
    again = kernel.execute("fabric = nbaccel.notebook_launcher(fabric_train, num_processes=2, timeout=120)", timeout=scaled(150))
    assert again.status == "ok", (again.error, again.stdout[-3000:])
    assert _close(_value(kernel, "fabric")[1], under_torchrun["fabric"])
    assert kernel.children() == []


SHELL_SEEN = """
def shell_seen():
    import builtins, sys, IPython, lightning_fabric.connector as connector, torch.distributed as dist
    from IPython.display import HTML, display
    display(HTML("<b>still shown</b>"))
    return {
        "ps1": hasattr(sys, "ps1"), "builtin": hasattr(builtins, "get_ipython"), "main": "get_ipython" in vars(sys.modules["__main__"]),
        "ipython": IPython.get_ipython() is None, "flag": connector._IS_INTERACTIVE, "elastic": dist.is_torchelastic_launched(),
        "exit": [type(exit).__module__, "exit" in vars(sys.modules["__main__"])],  # Python's exit(): SystemExit, as in a script
    }

from nbaccel.testing import CollectingSink
sink = CollectingSink()
seen = nbaccel.notebook_launcher(shell_seen, num_processes=2, output=sink)
shown = [e["data"]["text/html"] for rank in (0, 1) for e in sink.events.get(rank, []) if e.get("type") == "display"]
print(json.dumps({"seen": seen, "shown": shown, "kernel": [hasattr(sys, "ps1"), get_ipython() is not None]}))
"""


def test_a_rank_sees_no_interactive_shell_but_display_still_reaches_the_kernel(kernel: Kernel) -> None:
    run = kernel.execute(SHELL_SEEN, timeout=scaled(60))
    assert run.status == "ok", (run.error, run.stdout[-3000:])
    got = json.loads(run.stdout.splitlines()[-1])
    expected = {"ps1": False, "builtin": False, "main": False, "ipython": True, "flag": False, "elastic": True, "exit": ["_sitebuiltins", False]}
    assert got["seen"] == [expected, expected]
    assert got["shown"] == ["<b>still shown</b>", "<b>still shown</b>"]
    assert got["kernel"] == [True, True]  # the kernel's own shell is untouched
