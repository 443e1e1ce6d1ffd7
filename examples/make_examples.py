"""Write the example notebooks (without outputs) from the cells below: ``python examples/make_examples.py``.

The notebooks are committed; this script is how they are kept tidy. Every notebook runs on a
CPU-only machine (two gloo ranks) and on GPUs (one rank per GPU) unchanged, so no cell names a
process count: the default is one rank per visible GPU, or two CPU ranks.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent

Cell = tuple[str, str] | tuple[str, str, list[str]]


def md(text: str) -> Cell:
    return ("markdown", text.strip())


def code(text: str, *tags: str) -> Cell:
    return ("code", text.strip(), list(tags))


QUICKSTART = [
    md("""
# Quickstart: `%%distributed` and `notebook_launcher`

nbaccel runs PyTorch code on several processes (*ranks*) straight from a notebook: one rank per
GPU, or two CPU ranks on gloo when the machine has no GPU. Every rank is forked from this kernel,
so it sees the notebook's variables and imports, and what it prints shows up here labelled with
its rank.
"""),
    code("%load_ext nbaccel"),
    md("""
## A cell on every rank

`%%distributed` runs the cell on every rank. `state` is predefined: nbaccel's `PartialState`,
which knows this rank's index, the number of ranks and the device to use (and sets up the
process group the first time it is used). Rank 0's last expression is the cell's result.
Pass `-n N` to choose the number of ranks; `%%distributed?` lists every option.
"""),
    code("""
%%distributed
import torch
import torch.distributed as dist

t = torch.tensor([state.process_index + 1.0], device=state.device)
dist.all_reduce(t)  # every rank adds its value: 1 + 2 + ...
print(f"rank {state.process_index} of {state.num_processes} on {state.device}: sum = {t.item():g}")
t.item()
"""),
    md("""
## Notebook variables in, every rank's value out

The cell sees the notebook's variables as they are when it starts. The names it assigns stay on
the ranks: `-o NAME` brings back the list of every rank's value (the last expression, or an
explicit `return`).
"""),
    code("""
greeting = "hello"
scale = 10
"""),
    code("""
%%distributed -o everyone
message = f"{greeting} from rank {state.process_index}"
print(message)
state.process_index * scale
"""),
    code("""
print("every rank's value:", everyone)
print("did `message` leak into the notebook?", "message" in globals())
"""),
    md("""
## When a rank fails

The cell fails too. The error names the rank, shows its traceback with the cell's own lines, its
last output, and how every rank ended; the other ranks are stopped. (This cell is tagged
`raises-exception`, so running the whole notebook goes on past it.)
"""),
    code(
        """
%%distributed
print(f"rank {state.process_index} starts")
if state.process_index == state.num_processes - 1:
    raise ValueError(f"rank {state.process_index} does not like this batch")
""",
        "raises-exception",
    ),
    md("""
## The same for a function: `notebook_launcher`

`nbaccel.notebook_launcher(function, args)` runs a function on every rank and returns the list of
every rank's return value, rank 0 first. The function can be defined right here in the notebook.
"""),
    code("""
import nbaccel


def mean_of_my_shard(numbers):
    state = nbaccel.PartialState()
    with state.split_between_processes(numbers) as mine:
        print(f"rank {state.process_index} averages {mine}")
        return sum(mine) / len(mine)


nbaccel.notebook_launcher(mean_of_my_shard, args=(list(range(8)),))
"""),
]


DDP_TRAINING = [
    md("""
# DDP training with per-rank progress bars

A small regression model trained with `DistributedDataParallel` on synthetic data. The data is
made once in the kernel; every forked rank sees it and trains on its own shard
(`DistributedSampler`). `state.device` is `cuda:<local rank>` on GPUs and `cpu` otherwise, so
the same cell runs on both. Each rank shows its own progress bar.
"""),
    code("%load_ext nbaccel"),
    code("""
import os
import tempfile

import torch

torch.manual_seed(0)
X = torch.randn(2048, 16)
true_w = torch.randn(16, 1)
y = X @ true_w + 0.1 * torch.randn(2048, 1)
checkpoint = os.path.join(tempfile.mkdtemp(prefix="nbaccel-example-"), "model.pt")
X.shape, y.shape
"""),
    md("""
## Train on every rank

The main process saves the trained weights to `checkpoint`; the cell's result is rank 0's final
loss, and `-o losses` keeps every rank's.
"""),
    code("""
%%distributed -o losses
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from tqdm.auto import tqdm

device = state.device
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
# DDP starts every replica from rank 0's weights and averages the gradients at each backward().
ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

dataset = TensorDataset(X, y)
sampler = DistributedSampler(dataset, num_replicas=state.num_processes, rank=state.process_index, seed=0)
loader = DataLoader(dataset, batch_size=64, sampler=sampler)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)

for epoch in range(3):
    sampler.set_epoch(epoch)
    for xb, yb in tqdm(loader, desc=f"rank {state.process_index} epoch {epoch}"):
        xb, yb = xb.to(device), yb.to(device)
        loss = F.mse_loss(ddp(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    state.print(f"epoch {epoch}: loss on rank 0's last batch {loss.item():.4f}")

state.wait_for_everyone()  # every rank has finished its last step before the weights are saved
if state.is_main_process:
    torch.save(model.state_dict(), checkpoint)
loss.item()
"""),
    md("""
## Back in the kernel

DDP kept the replicas identical, so the saved weights are the trained model. Load them into a
model here and measure the error on the whole data set.
"""),
    code("""
print("final loss of each rank:", [round(loss, 4) for loss in losses])

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
model.load_state_dict(torch.load(checkpoint, map_location="cpu"))  # keep CUDA out of the kernel
with torch.no_grad():
    mse = torch.nn.functional.mse_loss(model(X), y).item()
print(f"mean squared error on all {len(X)} samples: {mse:.4f}")
assert mse < torch.nn.functional.mse_loss(torch.zeros_like(y), y).item()
"""),
    code("""
import shutil

shutil.rmtree(os.path.dirname(checkpoint))
"""),
]


EXECUTION_PROCESS = [
    md("""
# Controlling which process runs what

When code runs on several processes at once, some of it should run only once (a log line, a
progress bar, saving the model), some only on a given process, and some only after every process
has reached the same point. `state` (nbaccel's `PartialState`) has Accelerate's tools for this.
"""),
    code("%load_ext nbaccel"),
    md("""
## Once per machine: `is_local_main_process`, `on_local_main_process`

A progress bar or a log line once per machine (server), not once per process.
"""),
    code("""
%%distributed
import time
from tqdm.auto import tqdm

for step in tqdm(range(5), desc="steps", disable=not state.is_local_main_process):
    time.sleep(0.01)

if state.is_local_main_process:
    print("nbaccel is the best (printed once per machine)")


@state.on_local_main_process
def do_my_thing():
    "Something done once per server"
    print(f"done once on this machine, by local process {state.local_process_index}")


do_my_thing()
"""),
    md("""
## Once overall: `is_main_process`, `on_main_process`, `print`

Once across every process and machine, e.g. to upload the final model. `state.print` prints once.
"""),
    code("""
%%distributed
if state.is_main_process:
    print("only the main process gets here: push to the hub, write the final report")


@state.on_main_process
def do_my_thing():
    "Something done once, on the main process"
    print(f"done once, by process {state.process_index}")


do_my_thing()
state.print(f"state.print prints once: {state.num_processes} processes are running")
"""),
    md("""
## On a given process: `on_process`, `on_local_process`

`on_process(process_index=...)` picks a global index; `on_local_process(local_process_idx=...)`
picks a local index on every machine. A process index that does not exist (1 on a single-GPU
machine) runs nowhere.
"""),
    code("""
%%distributed
@state.on_process(process_index=1)
def on_index_one():
    "Something done on process index 1"
    print(f"done on process index {state.process_index}")


@state.on_local_process(local_process_idx=0)
def on_local_zero():
    "Something done on local process 0 of each machine"
    print(f"done on local process {state.local_process_index} of this machine")


on_index_one()
on_local_zero()
"""),
    md("""
## Waiting: `wait_for_everyone`

Some processes finish sooner than others. `wait_for_everyone()` blocks each process until all of
them reach it, e.g. before saving a model that every process trained.
"""),
    code("""
%%distributed
import time

time.sleep(0.2 * state.process_index)  # the higher the index, the slower
print(f"process {state.process_index} reached the barrier at {time.strftime('%X')}")
state.wait_for_everyone()
print(f"process {state.process_index} passed it")
"""),
    md("""
## The main process first: `main_process_first`

The main process runs the block first (downloading a data set, building a cache); the others run
it after, and find the work done.
"""),
    code("""
import tempfile

cache_dir = tempfile.mkdtemp(prefix="nbaccel-example-")
"""),
    code("""
%%distributed
import json
import os

path = os.path.join(cache_dir, "dataset.json")
with state.main_process_first():
    if not os.path.exists(path):
        print(f"process {state.process_index} prepares the data set")
        with open(path, "w") as f:
            json.dump(list(range(10)), f)
    else:
        print(f"process {state.process_index} finds it ready")
    with open(path) as f:
        data = json.load(f)
len(data)
"""),
    code("""
import shutil

shutil.rmtree(cache_dir)
"""),
    md("""
## Sharing out the work: `split_between_processes`

Each process gets its own contiguous part of a list, tuple, dict or tensor. With
`apply_padding=True` every process gets the same number of items (the last one repeated), which
is what `gather` needs.
"""),
    code("""
%%distributed -o shares
prompts = ["a cat", "a dog", "a bird", "a fish", "a frog"]
with state.split_between_processes(prompts) as mine:
    print(f"process {state.process_index} handles {mine}")
with state.split_between_processes(prompts, apply_padding=True) as padded:
    pass
mine, padded
"""),
    code("""
for index, (mine, padded) in enumerate(shares):
    print(f"process {index}: {mine} (padded: {padded})")
"""),
]


ACCELERATE = [
    md("""
# An `accelerate.Accelerator` training loop under `%%distributed`

Code written for Accelerate runs unchanged in a `%%distributed` cell: every rank is launched with
the environment Accelerate reads (rank, world size, rendezvous, mixed precision), so
`Accelerator()` joins the ranks' process group, `prepare` shards the data, and `gather_for_metrics`
collects results from every rank.
"""),
    code("%load_ext nbaccel"),
    code("""
# Imported once in the kernel: every forked rank inherits it instead of importing it again.
import accelerate
import torch

torch.manual_seed(0)
X = torch.randn(1024, 8)
y = (X.sum(dim=1, keepdim=True) > 0).float()
accelerate.__version__
"""),
    md("""
## Accelerate's `PartialState` on its own

Accelerate's scripts often start from `PartialState()` rather than an `Accelerator`. On CPU ranks
Accelerate itself would count one process per rank unless told `cpu=True`; in an nbaccel launch
it sees the launch's ranks either way.
"""),
    code("""
%%distributed -o worlds
from accelerate import PartialState

acc_state = PartialState()
acc_state.print(acc_state)  # once, on the main process
acc_state.distributed_type.value, acc_state.num_processes, acc_state.process_index
"""),
    code("""
print(worlds)
assert [index for _, _, index in worlds] == list(range(len(worlds)))
assert all(processes == len(worlds) for _, processes, _ in worlds)
"""),
    code("""
%%distributed -o accuracies
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
loader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
accelerator.print(f"{accelerator.num_processes} processes, {accelerator.distributed_type}, device {accelerator.device}")

for epoch in range(3):
    model.train()
    for xb, yb in loader:
        loss = F.binary_cross_entropy_with_logits(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.print(f"epoch {epoch}: loss {loss.item():.3f}")

model.eval()
correct = total = 0
with torch.no_grad():
    for xb, yb in loader:
        predictions, labels = accelerator.gather_for_metrics(((model(xb) > 0).float(), yb))
        correct += (predictions == labels).sum().item()
        total += labels.numel()
accelerator.wait_for_everyone()
correct / total
"""),
    code("""
# gather_for_metrics gave every rank the whole data set's predictions: the same accuracy everywhere.
print(accuracies)
assert len(set(accuracies)) == 1 and accuracies[0] > 0.8
"""),
]


PERSISTENT_WORKERS = [
    md("""
# Persistent workers: build a model in one cell, train it over several

`%%distributed` cells normally start their ranks and end them with the cell. After
`%distributed start`, they run on *persistent workers* instead: the same processes, the same
process group and the same GPU memory from one cell to the next, and each rank keeps its own
variables. So you can build a model in one cell, train it a few epochs at a time, look at it,
change the learning rate, and train on, the way you work in any notebook.

This notebook runs unchanged on GPUs (one rank per GPU) and on a CPU-only machine (two CPU ranks
on gloo).
"""),
    code("%load_ext nbaccel"),
    code("%distributed start"),
    md("""
## Data from the notebook

The workers were forked with a copy of the notebook's variables. What you define afterwards, send
with `%distributed push` (by value, to every rank).
"""),
    code("""
import torch

torch.manual_seed(0)
X = torch.randn(2048, 16)
true_w = torch.randn(16, 1)
y = X @ true_w + 0.1 * torch.randn(2048, 1)
"""),
    code("%distributed push X y"),
    md("""
## Build the model once

Everything this cell assigns (the model, its DDP wrapper, the optimizer, the data loader, the
`train_one_epoch` function) stays on each rank for the next cells. The cell's result is rank 0's
last expression: here the model, shown as its text.
"""),
    code("""
%%distributed
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

device = state.device
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
# DDP starts every replica from rank 0's weights and averages the gradients at each backward().
ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
dataset = TensorDataset(X, y)
sampler = DistributedSampler(dataset, num_replicas=state.num_processes, rank=state.process_index, seed=0)
loader = DataLoader(dataset, batch_size=64, sampler=sampler)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
epoch = 0


def train_one_epoch():
    global epoch
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        loss = F.mse_loss(ddp(xb.to(device)), yb.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    epoch += 1
    return loss.item()


model
"""),
    md("""
## Train over several cells

Each cell trains one more epoch on the same model. `state.print` prints once (rank 0).
"""),
    code("""
%%distributed
loss = train_one_epoch()
state.print(f"epoch {epoch}: loss {loss:.4f}")
"""),
    code("""
%%distributed
loss = train_one_epoch()
state.print(f"epoch {epoch}: loss {loss:.4f}")
"""),
    md("""
Change something between cells, as you would in a notebook: a smaller learning rate for the
last epochs. `-o losses` keeps every rank's value (its loss on its last batch).
"""),
    code("""
%%distributed -o losses
for group in optimizer.param_groups:
    group["lr"] = 0.01
for _ in range(2):
    loss = train_one_epoch()
state.print(f"epoch {epoch}: loss {loss:.4f}")
loss
"""),
    code("""
print("last loss of each rank:", [round(value, 4) for value in losses])
"""),
    md("""
## Look at the workers, bring the weights back

`%distributed status` shows each rank's process, device, memory and last cell.
`%distributed pull` brings a rank's variable into the notebook, with tensors on the CPU (a module
comes back as its `state_dict`). DDP kept the replicas identical, so rank 0's weights are the
trained model.
"""),
    code("%distributed status"),
    code("%distributed pull model --rank 0 -o weights"),
    code("""
trained = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
trained.load_state_dict(weights)
with torch.no_grad():
    mse = torch.nn.functional.mse_loss(trained(X), y).item()
print(f"mean squared error on all {len(X)} samples: {mse:.4f}")
assert mse < torch.nn.functional.mse_loss(torch.zeros_like(y), y).item()
"""),
    md("""
## Stop

`%distributed stop` ends the workers (and frees their GPU memory); `%%distributed` cells are
one-shot launches again. Shutting the kernel down or restarting it stops them too.
"""),
    code("%distributed stop"),
]


HF_TRAINER = [
    md("""
# A Hugging Face `Trainer` under `%%distributed`

`transformers.Trainer` runs unchanged in a `%%distributed` cell: it reads the rank, world size and
device from the environment each rank is launched with, wraps the model in DDP and gives each
rank its own shard of every batch. Nothing is downloaded here: the model is a tiny GPT-2 built
from a config, and the data are sequences of consecutive tokens, easy to learn in a few dozen
steps. Each rank shows its own progress bar; rank 0 logs the loss and saves the model.
"""),
    code("%load_ext nbaccel"),
    code("""
import os
import tempfile

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

VOCAB, LENGTH, SAMPLES = 32, 16, 512


class CountingSequences(torch.utils.data.Dataset):
    "Sequences of consecutive tokens (mod VOCAB) from random starts; remembers which it served."

    def __init__(self):
        starts = torch.randint(0, VOCAB, (SAMPLES, 1), generator=torch.Generator().manual_seed(0))
        self.tokens = (starts + torch.arange(LENGTH)) % VOCAB
        self.served = []

    def __len__(self):
        return SAMPLES

    def __getitem__(self, index):
        self.served.append(index)
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class RankRun:
    "What one rank brings back: the indices it was served in each epoch and the losses it logged."

    def __init__(self, shards, losses):
        self.shards, self.losses = shards, losses

    def __repr__(self):
        return f"RankRun({len(self.shards)} epochs of {len(self.shards[0])} samples, loss {self.losses[0]:.3f} -> {self.losses[-1]:.3f})"


config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
output_dir = tempfile.mkdtemp(prefix="nbaccel-trainer-")
transformers.__version__
"""),
    md("""
## Train on every rank

`RankProgress` is a `TrainerCallback` that gives every rank a progress bar (the `Trainer`'s own
bar is on rank 0 only); `ShardLog` keeps the indices each rank was served in each epoch.
`trainer.save_model` writes the model on rank 0 only. `-o runs` brings back every rank's shards
and logged losses, as a `RankRun` (defined above, in the kernel).
"""),
    code("""
%%distributed -o runs
from tqdm.auto import tqdm


class RankProgress(TrainerCallback):
    def on_train_begin(self, args, train_state, control, **kwargs):
        self.bar = tqdm(total=train_state.max_steps, desc=f"rank {args.process_index}")

    def on_step_end(self, args, train_state, control, **kwargs):
        self.bar.update(1)

    def on_train_end(self, args, train_state, control, **kwargs):
        self.bar.close()


class ShardLog(TrainerCallback):
    def __init__(self, data):
        self.data, self.shards = data, []

    def on_epoch_end(self, args, train_state, control, **kwargs):
        self.shards.append(sorted(self.data.served))
        self.data.served.clear()


torch.manual_seed(0)
data = CountingSequences()
shards = ShardLog(data)
args = TrainingArguments(
    output_dir=output_dir, num_train_epochs=3, per_device_train_batch_size=16, learning_rate=3e-3,
    logging_steps=8, save_strategy="no", report_to="none", disable_tqdm=True,
    dataloader_pin_memory=False, ddp_find_unused_parameters=False,
)
trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data, callbacks=[RankProgress(), shards])
trainer.train()
trainer.save_model(output_dir)  # the Trainer writes on the main process only
print(f"rank {args.process_index} of {args.world_size}: {len(shards.shards[0])} samples per epoch")
RankRun(shards.shards, [entry["loss"] for entry in trainer.state.log_history if "loss" in entry])
"""),
    md("""
## Back in the kernel

In each epoch the ranks were served disjoint shards that together cover the data set; DDP kept
their replicas identical, so every rank logged the same losses, and they went down. The model
rank 0 saved predicts the next token of a sequence it never saw.
"""),
    code("""
for epoch in range(3):
    epoch_shards = [set(run.shards[epoch]) for run in runs]
    assert sum(len(s) for s in epoch_shards) == SAMPLES == len(set().union(*epoch_shards)), "shards overlap"
assert all(run.losses == runs[0].losses for run in runs)
losses = runs[0].losses
print(f"{len(runs)} ranks, {len(epoch_shards[0])} samples each per epoch; loss {losses[0]:.3f} -> {losses[-1]:.3f}")
assert losses[-1] < losses[0]

print("saved:", sorted(os.listdir(output_dir)))
model = GPT2LMHeadModel.from_pretrained(output_dir)  # on the CPU: the kernel keeps CUDA untouched
sequence = (torch.arange(LENGTH) + 5) % VOCAB
with torch.no_grad():
    predicted = model(sequence[None, :-1]).logits.argmax(-1)[0]
accuracy = (predicted[4:] == sequence[5:]).float().mean().item()
print(f"next-token accuracy after the first few tokens: {accuracy:.0%}")
"""),
    code("""
import shutil

shutil.rmtree(output_dir)
"""),
]


FSDP2 = [
    md("""
# FSDP2: `fully_shard` under `%%distributed`

With FSDP (fully sharded data parallel) each rank keeps only its shard of every parameter,
gradient and optimizer state, and gathers a layer's full weights just for its forward and
backward. PyTorch's FSDP2 API is `torch.distributed.fsdp.fully_shard`: applied to each layer and
then to the whole model, it turns the parameters into `DTensor`s sharded along their first
dimension. It runs on GPUs with NCCL and, as here on a CPU-only machine, on gloo.
"""),
    code("%load_ext nbaccel"),
    code("""
import os
import tempfile

import torch

torch.manual_seed(0)
X = torch.randn(1024, 16)
y = X @ torch.randn(16, 1) + 0.1 * torch.randn(1024, 1)
checkpoint = os.path.join(tempfile.mkdtemp(prefix="nbaccel-fsdp-"), "model.pt")


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
"""),
    md("""
## Shard, train, save

Each rank trains on its own slice of the data. To save, `get_model_state_dict` with
`full_state_dict=True, cpu_offload=True` gathers the full weights onto rank 0's CPU (the other
ranks get an empty dict), and rank 0 writes them.
"""),
    code("""
%%distributed -o losses
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

device = state.device  # the process group is up from here on: FSDP needs it
torch.manual_seed(0)  # the same initial weights on every rank
model = make_model().to(device)
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
weight = model[0].weight
print(f"rank {state.process_index}: {type(weight).__name__} of shape {tuple(weight.shape)}, this rank holds {tuple(weight.to_local().shape)}")

optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
with state.split_between_processes(list(range(len(X)))) as mine:
    xb, yb = X[mine].to(device), y[mine].to(device)
for step in range(60):
    loss = F.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 20 == 0:
        state.print(f"step {step}: loss {loss.item():.4f}")

full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if state.is_main_process:
    torch.save(full, checkpoint)
loss.item()
"""),
    md("""
## Back in the kernel

The saved state dict is an ordinary one: load it into the unsharded model.
"""),
    code("""
model = make_model()
model.load_state_dict(torch.load(checkpoint))
with torch.no_grad():
    mse = torch.nn.functional.mse_loss(model(X), y).item()
print(f"final loss on each rank's slice: {[round(l, 4) for l in losses]}; on all {len(X)} samples: {mse:.4f}")
assert mse < torch.nn.functional.mse_loss(torch.zeros_like(y), y).item() / 10
"""),
    code("""
import shutil

shutil.rmtree(os.path.dirname(checkpoint))
"""),
]


TWO_NODES = [
    md("""
# Several machines: a cluster of node agents

A notebook can drive ranks on several machines. The kernel makes a **cluster** (it listens on one
address and keeps a secret in a private file); every node runs `nbaccel-agent`, which joins it;
launches then run on every rank of every node, with the same live output, results in rank order
and root-cause errors as on one machine. See docs/multinode.md for starting agents by hand, by
ssh or under Slurm, and for what the network must be trusted with.

Here both "nodes" are this machine: two agents on loopback, two ranks each.
"""),
    code("""
import os, subprocess, sys
import nbaccel

cluster = nbaccel.Cluster("127.0.0.1:0")   # on real machines: this machine's private address
cluster                                     # says what to run on each node
"""),
    md(
        "On each node you would run the command shown above. Here the notebook starts two agents itself (in their own sessions, so that interrupting a cell does not reach them)."
    ),
    code("""
argv = [sys.executable, "-m", "nbaccel.agent", cluster.address, "--token-file", cluster.token_file, "--nproc-per-node", "2"]
agents = [subprocess.Popen(argv, start_new_session=True) for _ in range(2)]
for node in cluster.wait(nodes=2, timeout=120):
    print(node.name, node.host, node.address, node.nproc, "ranks", node.gpus, "GPUs")
"""),
    md(
        "## A function on every rank of every node\n\nEach rank sees the variables torchrun would set (RANK, LOCAL_RANK, NODE_RANK, ...); `PartialState` knows its place; the values come back in global rank order."
    ),
    code("""
def where_am_i():
    import torch, torch.distributed as dist
    state = nbaccel.PartialState(cpu=True)
    total = torch.tensor([1.0]); dist.all_reduce(total)
    print(f"rank {state.process_index} of {state.num_processes}, node {os.environ['NODE_RANK']}, local rank {state.local_process_index}")
    return state.process_index, int(os.environ["NODE_RANK"]), total.item()

nbaccel.notebook_launcher(where_am_i, cluster=cluster)
"""),
    md("## A rank that fails on node 1\n\nThe error names the rank and its node, with its traceback; every other rank on every node is stopped."),
    code(
        """
def fails_on_node_1():
    import time
    if os.environ["NODE_RANK"] == "1" and os.environ["LOCAL_RANK"] == "1":
        raise ValueError("node 1 has had enough")
    time.sleep(30)

nbaccel.notebook_launcher(fails_on_node_1, cluster=cluster)
""",
        "raises-exception",
    ),
    md("## Persistent workers across the nodes\n\nOne process group that stays, and namespaces that live from call to call."),
    code("""
pool = nbaccel.start_workers(cluster=cluster)
print(pool.run(lambda: int(os.environ["RANK"])))   # the same workers each time
pool.push(offset=100)                               # a variable in every rank's namespace
pool.pull("offset", rank=3)
"""),
    code("""
pool.stop()
cluster.close()                              # the agents stop their ranks and exit
[agent.wait(15) for agent in agents]
"""),
]


SHARDED_WORKERS = [
    md("""
# A sharded model that lives across cells

A model too big for one GPU is sharded over the workers once and stays there: trained over
several cells, looked at, saved, reloaded on another number of workers, and brought back into the
notebook whole. `%distributed push model --shard` places a notebook model on the workers with
FSDP2's `fully_shard` (each rank receives only its slice of every parameter); `%distributed save`
and `load` use `torch.distributed.checkpoint`, which reshards; `%distributed pull` gathers the
full weights, one parameter at a time. It runs on 2 CPU ranks here, and unchanged on GPUs.
"""),
    code("%load_ext nbaccel"),
    code("""
import copy
import os
import tempfile

import torch
import torch.nn.functional as F

VOCAB, WIDTH, LENGTH = 32, 32, 12


class TinyLM(torch.nn.Module):
    \"\"\"A one-block transformer that predicts the next token.\"\"\"

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.block = torch.nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        hidden = self.block(self.embed(tokens), src_mask=mask, is_causal=True)
        return self.head(hidden.reshape(-1, WIDTH))  # (tokens, VOCAB): a new tensor, not a view (FSDP2 warns about views)


def lm_loss(model, tokens):
    return F.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:].reshape(-1))


def train(model, optimizer, tokens, steps):
    for _ in range(steps):
        loss = lm_loss(model, tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


torch.manual_seed(0)
data = (torch.arange(LENGTH + 1) * 3 + torch.randint(0, VOCAB, (12, 1))) % VOCAB  # 12 sequences: 2, 3 or 4 equal slices
model = TinyLM()
reference = copy.deepcopy(model)  # trained in this process, as a single GPU would: the losses must agree
checkpoint = os.path.join(tempfile.mkdtemp(prefix="nbaccel-sharded-"), "ckpt")
"""),
    md("""
## Shard it onto the workers

Each rank gets its slices of the parameters as `DTensor`s; `%distributed status` shows what each
holds, of the full model's size.
"""),
    code("""
%distributed start
%distributed push model --shard
"""),
    code("""
%%distributed
workers, device = state.num_processes, state.device.type
p = model.embed.weight
print(f"rank {state.process_index}: {type(p).__name__} {tuple(p.shape)}, holds {tuple(p.to_local().shape)}")
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
mine = data[state.process_index :: state.num_processes].to(state.device)  # equal slices: FSDP's averaged gradient is the whole batch's
"""),
    code("%distributed status"),
    md("""
## Train across cells

The model and its optimizer stay on the workers between cells.
"""),
    code("""
%%distributed
state.print(f"after 10 steps: loss on rank 0's slice {train(model, optimizer, mine, 10):.4f}")
"""),
    code("""
%%distributed
state.print(f"after 20 steps: loss on rank 0's slice {train(model, optimizer, mine, 10):.4f}")
"""),
    md("""
## Save, then reload on another number of workers

The checkpoint is written by every rank (its own shards) into a temporary folder, renamed once
complete. Another number of workers loads it: DCP reshards. On CPU we go from 2 ranks to 3; on
GPUs from N to N // 2 (or 1).
"""),
    code("""
%distributed save {checkpoint} model optimizer
%distributed pull workers -o n
%distributed pull device -o kind
%distributed stop
"""),
    code("""
other = 3 if kind == "cpu" else max(1, n // 2)
fresh = TinyLM()  # other weights: the checkpoint replaces them
%distributed start -n {other}
%distributed push fresh --shard
"""),
    code("""
%%distributed
model = fresh
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
mine = data[state.process_index :: state.num_processes].to(state.device)
"""),
    code("""
%distributed load {checkpoint} model optimizer
"""),
    code("""
%%distributed
state.print(f"{state.num_processes} workers, after 25 steps: loss on rank 0's slice {train(model, optimizer, mine, 5):.4f}")
"""),
    md("""
## Back into the notebook

`%distributed pull` gathers every parameter in full: the notebook gets an ordinary state dict
(plain CPU tensors of the full shapes), which loads into the unsharded model.
"""),
    code("""
%distributed pull model -o weights
%distributed stop
"""),
    code("""
trained = TinyLM()
trained.load_state_dict(weights)
train(reference, torch.optim.Adam(reference.parameters(), lr=1e-2), data, 25)  # the same 25 steps in one process, on the whole batch
with torch.no_grad():
    sharded_loss, reference_loss = lm_loss(trained, data).item(), lm_loss(reference, data).item()
print(f"loss of the pulled model: {sharded_loss:.5f}; single-process reference: {reference_loss:.5f}")
assert abs(sharded_loss - reference_loss) < 1e-4
"""),
    code("""
import shutil

shutil.rmtree(os.path.dirname(checkpoint))
"""),
]


NOTEBOOKS = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_ddp_training.ipynb": DDP_TRAINING,
    "03_execution_process.ipynb": EXECUTION_PROCESS,
    "04_accelerate.ipynb": ACCELERATE,
    "05_persistent_workers.ipynb": PERSISTENT_WORKERS,
    "06_hf_trainer.ipynb": HF_TRAINER,
    "07_fsdp2.ipynb": FSDP2,
    "08_two_nodes.ipynb": TWO_NODES,
    "09_sharded_workers.ipynb": SHARDED_WORKERS,
}


def build(cells: list[Cell]) -> nbformat.NotebookNode:
    notebook = new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.metadata["language_info"] = {"name": "python"}
    for kind, source, *rest in cells:
        if kind == "markdown":
            notebook.cells.append(new_markdown_cell(source))
        else:
            cell = new_code_cell(source)
            if rest and rest[0]:
                cell.metadata["tags"] = rest[0]
            notebook.cells.append(cell)
    for index, cell in enumerate(notebook.cells):
        cell.id = f"cell-{index:02d}"  # stable ids: regenerating gives the same files
    return notebook


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(cells), HERE / name)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
