"""nvidia-smi's recorded outputs and a fake nvidia-smi, shared by the GPU tests."""

from __future__ import annotations

from pathlib import Path

# Recorded shapes of `nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total
# --format=csv,noheader` and of the banner of plain `nvidia-smi` (driver 550 and 470 layouts).
H100_QUERY = "".join(
    f"{i}, NVIDIA H100 80GB HBM3, GPU-5e2c6e36-8c3a-3b8f-1f7a-6d2f4e1c9a0{i}, 550.54.15, 81559 MiB\n"
    for i in range(8))
H100_HEADER = """\
Thu Mar 14 09:12:44 2024
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
"""


A100_QUERY = """\
0, NVIDIA A100-SXM4-40GB, GPU-1a2b3c4d-0000-1111-2222-333344445555, 535.129.03, 40960 MiB
1, NVIDIA A100-SXM4-40GB, GPU-1a2b3c4d-0000-1111-2222-333344445556, 535.129.03, 40960 MiB
2, NVIDIA A100-SXM4-40GB, GPU-1a2b3c4d-0000-1111-2222-333344445557, 535.129.03, 40960 MiB
3, NVIDIA A100-SXM4-40GB, GPU-1a2b3c4d-0000-1111-2222-333344445558, 535.129.03, 40960 MiB
"""
A100_HEADER = """\
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.129.03             Driver Version: 535.129.03   CUDA Version: 12.2     |
"""


V100_QUERY = "0, Tesla V100-SXM2-16GB, GPU-0c9d8e7f-aaaa-bbbb-cccc-ddddeeeeffff, 470.182.03, 16160 MiB\n"
V100_HEADER = """\
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 470.182.03   Driver Version: 470.182.03   CUDA Version: 11.4     |
|-------------------------------+----------------------+----------------------+
"""


NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
             "that the latest NVIDIA driver is installed and running.\n\n")
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.54\n"


def fake_smi(folder: Path, query: str, header: str, status: int = 0) -> Path:
    """An `nvidia-smi` that prints `query` for the query and `header` otherwise."""
    folder.mkdir(exist_ok=True)
    (folder / "query.txt").write_text(query)
    (folder / "header.txt").write_text(header)
    smi = folder / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$1" in
  --query-gpu=*) cat '{folder}/query.txt' ;;
  *) cat '{folder}/header.txt' ;;
esac
exit {status}
""")
    smi.chmod(0o755)
    return folder
