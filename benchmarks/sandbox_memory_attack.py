"""How much host memory can one sandbox worker hold beyond its limit? (issue 30, item 8)

One cell grows memory that ``RLIMIT_AS`` does not count, in 8 MiB writes, aiming at twice the
limit: ``--kind memfd`` fills memfds of 16 MiB each (the file size limit caps one), ``--kind tmpfs``
fills files in a scratch folder on /dev/shm. Prints the sandbox's report line, what the cell says,
and how much the host's ``Shmem`` (/proc/meminfo) grew while the worker lived: memory that no
process's RSS shows. The parent's rule check is switched off: the kernel layers must hold for any
code, including code the rules refuse. It allocates up to twice ``--limit-mib`` of real memory.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/sandbox_memory_attack.py --kind memfd --limit-mib 256
"""

from __future__ import annotations

import argparse
import asyncio

from sage_rl.sandbox import Sandbox, SandboxLimits, session

FILL = {
    "memfd": """
import os, time
t = time.time(); held = 0; chunk = b"x" * (8 << 20); fds = []
try:
    while held < {target}:
        fd = os.memfd_create("x"); fds.append(fd)
        for _ in range(2):  # 16 MiB per memfd: RLIMIT_FSIZE caps each file
            os.write(fd, chunk); held += len(chunk)
except OSError as e:
    print("stopped:", e)
print(f"{{len(fds)}} memfds held {{held >> 20}} MiB in {{time.time() - t:.2f}} s")
""",
    "tmpfs": """
import os, time
t = time.time(); held = 0; chunk = b"x" * (8 << 20); i = 0
try:
    while held < {target}:
        with open(f"f{{i // 2}}", "ab") as f:  # 16 MiB per file
            f.write(chunk)
        held += len(chunk); i += 1
except OSError as e:
    print("stopped:", e)
print(f"tmpfs scratch held {{held >> 20}} MiB in {{time.time() - t:.2f}} s")
""",
}


def shmem_mib() -> float:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Shmem:")) / 1024


async def attack(sandbox: Sandbox, code: str) -> None:
    s = await sandbox.acquire(lambda app, api, kwargs: None)
    before = shmem_mib()
    r = await s.execute(code, "<cell-1>")
    grew = shmem_mib() - before
    print("cell ok:", r.ok, "|", r.observation.strip()[-300:])
    print(f"host Shmem grew by {grew:.0f} MiB while the worker lived")
    await s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=sorted(FILL), default="memfd")
    ap.add_argument("--limit-mib", type=int, default=256, help="address_space_bytes, in MiB")
    args = ap.parse_args()
    session.refusal = lambda code: None  # type: ignore[attr-defined]  # the layers below the rules
    limits = SandboxLimits(
        address_space_bytes=args.limit_mib << 20,
        file_size_bytes=16 << 20,
        scratch_root="/dev/shm" if args.kind == "tmpfs" else None,
    )
    with Sandbox(limits, spares=0) as sandbox:
        assert sandbox.isolation is not None
        print(sandbox.isolation.line())
        print(f"limit {args.limit_mib} MiB")
        asyncio.run(attack(sandbox, FILL[args.kind].format(target=2 * (args.limit_mib << 20))))


if __name__ == "__main__":
    main()
