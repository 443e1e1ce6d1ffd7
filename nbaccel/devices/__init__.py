"""The bottom layer: what the machine's GPUs and their drivers say, asked without initialising CUDA, HIP or Level Zero.

Everything above (the kernel's preflight and plan, the node agent, the state API) asks here
(``inventory.gpu_inventory``: the one GPU map), never ``torch.cuda`` or ``torch.xpu``, whose
counting and capability calls can initialise the GPU runtime in the kernel and so poison every
later fork. This layer imports only the standard library and ``nbaccel.errors``.

Example:
    >>> from nbaccel.devices import driver, nvml
    >>> driver.cuda_initialised()  # this process never ran cuInit
    False
"""
