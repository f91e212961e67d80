"""llama.cpp on the engine bench's workload (run by ``engine_bench.py`` with a bench-only venv's
Python, which has ``llama-cpp-python`` but not necessarily torch or sage-rl).

Reads the workload as JSON on stdin: ``gguf``, ``threads``, ``prompts`` (token ids per episode),
``obs_ids``, ``turns``, ``gen``. llama-cpp-python's high-level API runs one sequence at a time, so
the episodes run one after another, each turn reusing the KV cache of the previous one (the
longest-prefix reuse of ``Llama.generate``): the best a user of that API gets. Prints JSON.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import llama_cpp

    job = json.load(sys.stdin)
    longest = max(len(p) for p in job["prompts"]) + job["turns"] * (job["gen"] + len(job["obs_ids"]))
    llm = llama_cpp.Llama(
        model_path=job["gguf"],
        n_ctx=longest + 64,
        n_batch=512,
        n_threads=job["threads"],
        n_threads_batch=job["threads"],
        seed=0,
        verbose=False,
    )
    wall, cpu, generated = time.perf_counter(), time.process_time(), 0
    for prompt in job["prompts"]:
        tokens = list(prompt)
        for _ in range(job["turns"]):
            gen: list[int] = []
            sampler = llm.generate(tokens, temp=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
            for token in sampler:
                gen.append(token)
                if len(gen) == job["gen"]:
                    break
            generated += len(gen)
            tokens += gen + job["obs_ids"]
    print(
        json.dumps(
            {
                "version": llama_cpp.__version__,
                "tokens": generated,
                "wall_s": time.perf_counter() - wall,
                "cpu_s": time.process_time() - cpu,
            }
        )
    )


if __name__ == "__main__":
    main()
