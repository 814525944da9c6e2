"""The backend names and their one-line descriptions: the one list that the options, the
CLI's ``--backend`` choices and help, and :func:`mpisdnn.backends.create` read."""

__all__ = ["NAMES", "HELP"]

#: The backend names, in the order ``--backend`` lists them (the first is the default).
NAMES = ("cpu", "reference", "gpu")
#: One line per backend, for ``--backend`` help texts (the CLI joins them).
HELP = {
    "cpu": "fused numba kernels on the CPU cores",
    "reference": "plain scipy (MATLAB semantics), what the tests compare to",
    "gpu": "CUDA kernels written with numba-cuda, on CuPy arrays (numba device arrays "
    "without CuPy); one GPU per rank",
}
