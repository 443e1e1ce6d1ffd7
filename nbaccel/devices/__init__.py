"""The bottom layer: what the machine's GPUs and CUDA driver say, asked without initialising CUDA.

Everything above (the kernel's preflight and plan, the node agent, the state API) asks here,
never ``torch.cuda``, whose counting and capability calls can run ``cuInit`` in the kernel and
so poison every later fork. This layer imports only the standard library and ``nbaccel.errors``.

Example:
    >>> from nbaccel.devices import driver, nvml
    >>> driver.cuda_initialised()  # this process never ran cuInit
    False
"""
