"""The README's main job: a real launch from a plain Python process.

One rank per visible GPU (two CPU ranks on gloo when there is none): every rank joins the
process group, all-reduces its rank, prints, and returns a value that comes back here.
"""

import nbaccel


def train_step(scale: float) -> dict:
    import torch
    import torch.distributed as dist

    state = nbaccel.PartialState()
    value = torch.tensor([float(state.process_index + 1)], device=state.device)
    dist.all_reduce(value)
    print(f"rank {state.process_index}/{state.num_processes} on {state.device}: all_reduce sum = {value.item():g}")
    state.wait_for_everyone()
    state.print("every rank is here (printed once, by the main process)")
    return {"rank": state.process_index, "sum": value.item() * scale}


if __name__ == "__main__":
    results = nbaccel.notebook_launcher(train_step, args=(1.0,))
    print("results by rank:", results)
