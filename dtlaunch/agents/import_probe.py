"""Facts that need a real `import torch` / `import horovod` (about a second of CPU).

Run by remote_probe.py in a child interpreter, once per host and installation (the result is
cached); prints one JSON document. Python >= 3.6, standard library only.
"""

import glob
import json
import os
from typing import Any, Dict


def loaded_mpi_library() -> Any:
    """The libmpi this process loaded with Horovod (its real file: the name carries the ABI),
    or None; read from the process's own memory map, so no tool is needed."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1]
                if os.path.basename(path).startswith("libmpi.so"):
                    return path
    except (OSError, IndexError):
        pass
    return None


def main() -> None:
    found: Dict[str, Any] = {}
    try:
        import torch

        found["torch"] = torch.__version__
        found["torch_cuda"] = getattr(torch.version, "cuda", None)
        try:
            nccl: Any = torch.cuda.nccl
            found["torch_nccl"] = ".".join(str(v) for v in nccl.version())
        except BaseException:
            found["torch_nccl"] = None
    except BaseException as e:
        found["torch_error"] = (type(e).__name__ + ": " + str(e)).strip()[:300]
    try:
        import horovod

        found["horovod"] = getattr(horovod, "__version__", None)
        base = os.path.dirname(horovod.__file__)
        found["frameworks"] = [
            name for folder, name in (("tensorflow", "TensorFlow"), ("torch", "PyTorch"),
                                      ("mxnet", "MXNet"))
            if glob.glob(os.path.join(base, folder, "mpi_lib*"))]
        if "torch" in found:
            import horovod.torch as hvd

            found["controllers"] = [name for name, built in (("MPI", hvd.mpi_built),
                                                             ("Gloo", hvd.gloo_built)) if built()]
            found["tensor_ops"] = [
                name for name, built in (("NCCL", hvd.nccl_built), ("DDL", hvd.ddl_built),
                                         ("CCL", hvd.ccl_built), ("MPI", hvd.mpi_built),
                                         ("Gloo", hvd.gloo_built)) if built()]
            # NCCL_VERSION_CODE when built with NCCL (0 without; a bool before 0.21).
            found["horovod_nccl"] = int(hvd.nccl_built())
            found["horovod_mpi_lib"] = loaded_mpi_library()
    except BaseException as e:
        found["horovod_error"] = (type(e).__name__ + ": " + str(e)).strip()[:300]
    print(json.dumps(found))


if __name__ == "__main__":
    main()
