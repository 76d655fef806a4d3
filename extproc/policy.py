"""The failure-policy table: what each stage of the request path does on its own unexpected
error and, separately, while the shared store (Redis) is down, read from the stages
themselves (`Stage.fail_closed`, `Stage.store_down`). The README shows this table; a test
keeps the two equal: `python -m extproc.policy` prints it."""

from __future__ import annotations

from .app import STAGES

OWN_ERROR = {
    True: "fail closed: JSON 500 `gate_error` with the request id",
    False: "fail open: skipped for that request, counted",
}
STORE_DOWN = {
    "not used": "not used",
    "skipped": "skipped, counted (no hits, no coalescing)",
    "skipped, or 503 where configured": "skipped, counted; 503 on `fail_closed_paths` / `fail_closed_tiers`",
    "local state only": "each process decides on its own windows until the store is back",
    "own verdicts only": "each process screens on its own: a text it has not seen is embedded",
}


def table() -> str:
    lines = ["| stage | on its own error | while the store is down |", "|---|---|---|"]
    for stage in STAGES:
        lines.append(f"| {stage.name} | {OWN_ERROR[stage.fail_closed]} | {STORE_DOWN[stage.store_down]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
