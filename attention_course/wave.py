"""Train several variants of one recipe at the same time on one device: a *wave* (issue 28).

A wave file (TOML) names a recipe and its runs, each with its own overrides and seed::

    name = "wave1"
    recipe = "gpu"
    max_seconds = 420            # every run's training budget (else the recipe's own)
    deadline = 540               # the whole wave's wall clock: a run still going then is stopped
    beam_size = 5                # validation and test decoding, fixed in advance
    length_penalty = 1.0
    test_sets = ["test_2016_flickr"]
    [common]                     # overrides for every run
    max_steps = 8000
    [[run]]
    name = "base-s1"
    seed = 1
    [[run]]
    name = "rdrop-a1"
    rdrop_alpha = 1.0

``python -m attention_course.wave WAVE.toml --out DIR`` starts one process per run, all at once on
one device (as N jobs share one GPU), shows their progress, waits, and writes DIR/table.json and
DIR/table.md. Each run's folder DIR/<run>/ holds its training run (run/, with its weights in half
precision too), its log, result.json, and its validation and test translations. Runs are compared on
validation only (all sentences, beam and length penalty fixed in advance); test is written and
never chosen on. The wave's GPU wall-clock runs from the first start to the last end (several models
at once count once); the runs' summed process time is reported beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

WAVE_KEYS = {"name", "recipe", "src", "tgt", "max_seconds", "deadline", "beam_size", "length_penalty",
             "test_sets", "common", "run"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")   # a run's folder name: safe in any file listing

# --smoke: the same wave, tiny: the toy corpus, a one-layer model, six steps (the CPU check that the
# whole path, launcher to table, runs before a GPU session spends its minutes on it)
SMOKE = dict(corpus="toy", vocab_size=300, min_frequency=1, d_model=32, num_heads=2, num_encoder_layers=1,
             num_decoder_layers=1, d_ff=64, max_tokens=600, max_steps=6, max_seconds=None, warmup=3,
             eval_every=3, checkpoint_every=2, average_last=2, val_bleu_sentences=8, bpe_dropout_samples=2,
             num_threads=1)
SMOKE_DEADLINE = 300.0


@dataclass(frozen=True)
class Wave:
    """A wave: runs of one recipe, each a name and its overrides (the common ones applied first)."""
    name: str
    recipe: str
    runs: list[dict]                   # {"name": ..., <TrainConfig field>: value, ...}
    common: dict = field(default_factory=dict)
    src: str = "en"
    tgt: str = "de"
    max_seconds: float | None = None
    deadline: float = 540.0
    beam_size: int = 5
    length_penalty: float = 1.0
    test_sets: tuple[str, ...] = ("test_2016_flickr",)
    smoke: bool = False

    def overrides(self, run: dict) -> dict:
        """A run's settings on top of the recipe: the common ones, the wave's budget, its own; --smoke last."""
        budget = {"max_seconds": self.max_seconds} if self.max_seconds is not None else {}
        own = {k: v for k, v in run.items() if k != "name"}
        return {**self.common, **budget, **own, **(SMOKE if self.smoke else {})}

    def config(self, run: dict):
        """The run's TrainConfig (a setting the trainer does not know raises ValueError, here and now)."""
        from .recipes import get_config

        known = {f.name for f in fields(get_config(self.recipe))} - {"name"}
        values = self.overrides(run)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"run {run['name']!r}: unknown setting(s) {', '.join(unknown)}")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        return replace(get_config(self.recipe), **values)


def load_wave(path: str | Path, smoke: bool = False, only=None) -> Wave:
    """Read and check a wave file: every run's recipe is built here, so a typo fails before any training."""
    table = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    unknown = sorted(set(table) - WAVE_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}; a wave file has {', '.join(sorted(WAVE_KEYS))}")
    runs = table.get("run", [])
    names = [r.get("name", "") for r in runs]
    if not runs or any(not NAME.fullmatch(n) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"{path}: give [[run]] tables with distinct names of letters, digits, '.', '_', '-': {names}")
    if only:
        missing = sorted(set(only) - set(names))
        if missing:
            raise ValueError(f"--only: no run named {', '.join(missing)} in {path} (runs: {', '.join(names)})")
        runs = [r for r in runs if r["name"] in only]
    wave = Wave(name=table.get("name", Path(path).stem), recipe=table.get("recipe", "gpu"), runs=runs,
                common=table.get("common", {}), src=table.get("src", "en"), tgt=table.get("tgt", "de"),
                max_seconds=None if smoke else table.get("max_seconds"),
                deadline=SMOKE_DEADLINE if smoke else float(table.get("deadline", Wave.deadline)),
                beam_size=table.get("beam_size", Wave.beam_size),
                length_penalty=table.get("length_penalty", Wave.length_penalty),
                test_sets=("test",) if smoke else tuple(table.get("test_sets", Wave.test_sets)), smoke=smoke)
    for run in wave.runs:
        wave.config(run)
    return wave


# --------------------------------------------------------------------------- one run (its own process)
def decode_split(model, tok, pairs, beam_size: int, length_penalty: float) -> tuple[list[str], dict]:
    """Translate every source of `pairs` and score it: (hypotheses, {bleu, bleu_lc, signature, sentences})."""
    from .evaluation import bleu, translate_texts

    t = time.time()
    hyps = translate_texts(model, tok, [s for s, _ in pairs], beam_size=beam_size, length_penalty=length_penalty)
    refs = [t for _, t in pairs]
    cased, signature = bleu(hyps, refs)
    lowered, _ = bleu(hyps, refs, lowercase=True)
    return hyps, {"bleu": round(cased, 2), "bleu_lc": round(lowered, 2), "signature": signature,
                  "sentences": len(pairs), "decode_seconds": round(time.time() - t, 1)}


def run_one(run_dir: Path) -> dict:
    """Train the run that run_dir/spec.json describes, decode validation and the test sets with the
    wave's fixed beam and length penalty, and write the translations and result.json (rewritten after
    training and after each decoded set: a run stopped at the deadline still reports what it did)."""
    import torch

    from .checkpoints import half_state
    from .data import load_pairs
    from .recipes import TrainConfig
    from .train import train

    spec = json.loads((run_dir / "spec.json").read_text())
    cfg = TrainConfig.from_dict(spec["config"])
    src, tgt, beam, lp = spec["src"], spec["tgt"], spec["beam_size"], spec["length_penalty"]
    run = train(cfg, src, tgt, out_dir=run_dir / "run", mirror=spec.get("mirror"), device=spec.get("device"),
                progress=False, log=lambda *a: print(*a, flush=True))
    # half-precision weights beside model.pt: what comes back from a GPU machine; `load_run` (and so
    # `attn-course evaluate`) reads them where model.pt is left behind
    torch.save(half_state(torch.load(run_dir / "run" / "model.pt", weights_only=True)),
               run_dir / "run" / "model.fp16.pt")
    s = run.summary
    result = {"name": spec["name"], "status": "decoding", "changes": spec["changes"], "seed": cfg.seed,
              "steps": s["steps"], "epochs": s["epochs"], "train_seconds": s["train_seconds"],
              "loop_seconds": s["loop_seconds"], "run_seconds": s["total_seconds"],
              "tokens_per_second": s["tokens_per_second"], "weights": s["weights"],
              "val_bleu_greedy": s["val_bleu_greedy"], "tests": {}, "device": s["device"],
              "decoding": f"beam {beam}, length penalty {lp:g} (fixed in advance)"}
    write_result(run_dir, result)
    for split in ("val", *spec["test_sets"]):
        pairs = load_pairs(cfg.corpus, split, src, tgt, spec.get("mirror"))
        hyps, score = decode_split(run.model, run.tokenizer, pairs, beam, lp)
        (run_dir / f"{split}.{src}-{tgt}.{tgt}").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        print(f"{split}: BLEU {score['bleu']:.2f} (-lc {score['bleu_lc']:.2f}), beam {beam}, "
              f"length penalty {lp:g}, {len(pairs)} sentences", flush=True)
        if split == "val":
            result["val"] = score
        else:
            result["tests"][split] = score
        write_result(run_dir, result)
    result["status"] = "done"
    if torch.cuda.is_available():
        result["max_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return write_result(run_dir, result)


def write_result(run_dir: Path, result: dict) -> dict:
    """result.json, with the process's CPU time so far; written whole, then renamed (never half a file)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 1)
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(run_dir / "result.json")
    return result


# --------------------------------------------------------------------------- the launcher
def worker_env(workers: int) -> dict:
    """Each process's environment: this library importable, unbuffered output, and its share of the
    host's cores for PyTorch's and the tokenizer's thread pools (N pools of every core fight)."""
    env = dict(os.environ)
    library = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (library, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    share = str(max(1, (os.cpu_count() or 1) // max(workers, 1)))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        env.setdefault(name, share)
    return env


def start_runs(wave: Wave, out: Path, device: str | None, mirror: str | None) -> dict[str, tuple]:
    """One process per run, all started now: name -> (process, its folder, its start time)."""
    from dataclasses import asdict

    from .recipes import get_config

    base = asdict(get_config(wave.recipe))
    env = worker_env(len(wave.runs))
    procs = {}
    for run in wave.runs:
        cfg = wave.config(run)
        folder = out / run["name"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "result.json").unlink(missing_ok=True)
        changes = {k: v for k, v in asdict(cfg).items()
                   if k in run and k != "name" and json.dumps(base.get(k)) != json.dumps(v)}
        spec = {"name": run["name"], "wave": wave.name, "recipe": wave.recipe, "config": asdict(cfg),
                "changes": changes, "src": wave.src, "tgt": wave.tgt, "beam_size": wave.beam_size,
                "length_penalty": wave.length_penalty, "test_sets": list(wave.test_sets), "device": device,
                "mirror": mirror}
        (folder / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
        with open(folder / "train.log", "w") as log:   # the child holds its own copy of the file
            proc = subprocess.Popen([sys.executable, "-m", "attention_course.wave", "--worker", str(folder)],
                                    stdout=log, stderr=subprocess.STDOUT, env=env)
        procs[run["name"]] = (proc, folder, time.monotonic())
    return procs


def progress_of(folder: Path) -> str:
    """A run's progress, read from its files (no messages between processes): the newest checkpoint's
    step, and the last validation BLEU (greedy) of its history."""
    steps = sorted((folder / "run" / "checkpoints").glob("step_*.pt"))
    step = int(steps[-1].stem.split("_")[1]) if steps else 0
    try:
        evaluations = [h for h in json.loads((folder / "run" / "history.json").read_text()) if "val_bleu" in h]
    except (OSError, ValueError):
        evaluations = []
    return f"{step}" + (f" ({evaluations[-1]['val_bleu']:.1f})" if evaluations else "")


def wait_for_runs(procs: dict, deadline: float, started: float, poll: float, log) -> dict[str, dict]:
    """Wait for every process, printing a progress line every `poll` seconds; at the deadline stop the
    ones still running. name -> {returncode, process_seconds, stopped}."""
    ended: dict[str, dict] = {}
    last_shown = 0.0
    while len(ended) < len(procs):
        now = time.monotonic()
        for name, (proc, _, t0) in procs.items():
            if name not in ended and proc.poll() is not None:
                ended[name] = {"returncode": proc.returncode, "process_seconds": round(now - t0, 1), "stopped": False}
        if now - started > deadline:
            for name, (proc, _, t0) in procs.items():
                if name not in ended:
                    stop(proc)
                    ended[name] = {"returncode": proc.returncode, "process_seconds": round(time.monotonic() - t0, 1),
                                   "stopped": True}
        if now - last_shown >= poll or len(ended) == len(procs):
            last_shown = now
            log(f"[{now - started:5.0f} s] " + "  ".join(
                f"{name} {progress_of(folder)}{state(ended.get(name))}" for name, (_, folder, _) in procs.items()))
        time.sleep(min(1.0, poll))
    return ended


def state(end: dict | None) -> str:
    """How a run's process ended, for the progress line ("" while it runs)."""
    if end is None:
        return ""
    return " stopped" if end["stopped"] else " done" if end["returncode"] == 0 else f" FAILED ({end['returncode']})"


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """End one run's process: politely, then for good."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def table_rows(wave: Wave, procs: dict, ended: dict[str, dict]) -> list[dict]:
    """One row per run: its result.json with the launcher's timing, or why there is none; best
    validation BLEU first (finished runs), then the rest."""
    rows = []
    for name, (_, folder, _) in procs.items():
        result_file = folder / "result.json"
        row = json.loads(result_file.read_text()) if result_file.is_file() else \
            {"name": name, "status": "training", "changes": json.loads((folder / "spec.json").read_text())["changes"]}
        if row["status"] != "done":
            why = "stopped at the wave's deadline" if ended[name]["stopped"] else f"failed (exit {ended[name]['returncode']})"
            row["status"] = f"{why} while {row['status']}"
            row["log_tail"] = (folder / "train.log").read_text(errors="replace").splitlines()[-5:]
        rows.append({**row, "process_seconds": ended[name]["process_seconds"]})
    return sorted(rows, key=lambda r: ("val" not in r, -r.get("val", {}).get("bleu", 0.0), r["status"] != "done"))


def shown_bleu(score: dict, key: str) -> str:
    return f"{score[key]:.2f}" if key in score else "-"


def markdown(table: dict) -> str:
    """The table as Markdown: one line per run, then the wave's totals."""
    tests = table["test_sets"]
    head = ["run", "changes", "seed", "steps", "train s", "tokens/s", "val greedy", "val BLEU", "val -lc"]
    head += [f"{t} BLEU" for t in tests] + [f"{t} -lc" for t in tests]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table["runs"]:
        changes = ", ".join(f"{k}={v}" for k, v in r["changes"].items()) or "(recipe)"
        if "steps" not in r:
            lines.append(f"| {r['name']} | {changes} | {r['status']} |" + " |" * (len(head) - 3))
            continue
        val, test = r.get("val", {}), r.get("tests", {})
        cells = [r["name"] + ("" if r["status"] == "done" else f" ({r['status']})"), changes, r["seed"], r["steps"],
                 f"{r['train_seconds']:.0f}", f"{r['tokens_per_second']:,}", f"{r['val_bleu_greedy']:.2f}",
                 shown_bleu(val, "bleu"), shown_bleu(val, "bleu_lc")]
        cells += [shown_bleu(test.get(t, {}), "bleu") for t in tests] + [shown_bleu(test.get(t, {}), "bleu_lc") for t in tests]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    t = table["totals"]
    lines.append("")
    lines.append(f"{table['wave']} ({table['recipe']}, {table['src']}->{table['tgt']}, {len(table['runs'])} runs at once "
                 f"on {t['device']}): {t['wall_seconds']:.0f} s of wall-clock for the whole wave; "
                 f"{t['process_seconds']:.0f} s of process time summed over the runs ({t['train_seconds']:.0f} s "
                 f"of it training). Decoding: {table['decoding']}. Chosen on validation only; test is written, "
                 "never chosen on.")
    return "\n".join(lines)


def launch(wave: Wave, out: str | Path, device: str | None = None, mirror: str | None = None, poll: float = 15.0,
           log=print) -> dict:
    """Run the wave: every run at once, progress every `poll` seconds, then the table (returned, and
    written to OUT/table.json and OUT/table.md)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"{wave.name}: {len(wave.runs)} runs of '{wave.recipe}' at once ({', '.join(r['name'] for r in wave.runs)}); "
        f"deadline {wave.deadline:.0f} s; progress: step (last greedy validation BLEU)")
    started = time.monotonic()
    procs = start_runs(wave, out, device, mirror)
    ended = wait_for_runs(procs, wave.deadline, started, poll, log)
    wall = time.monotonic() - started
    rows = table_rows(wave, procs, ended)
    done = [r for r in rows if r["status"] == "done"]
    trained = [r for r in rows if "device" in r]
    table = {"wave": wave.name, "recipe": wave.recipe, "src": wave.src, "tgt": wave.tgt, "smoke": wave.smoke,
             "test_sets": list(wave.test_sets), "decoding": f"beam {wave.beam_size}, length penalty "
             f"{wave.length_penalty:g} (fixed in advance), all validation sentences",
             "totals": {"wall_seconds": round(wall, 1), "device": trained[0]["device"] if trained else "unknown",
                        "process_seconds": round(sum(r["process_seconds"] for r in rows), 1),
                        "train_seconds": round(sum(r.get("train_seconds", 0.0) for r in rows), 1),
                        "cpu_seconds": round(sum(r.get("cpu_seconds", 0.0) for r in rows), 1),
                        "finished": len(done), "runs": len(rows)},
             "runs": rows}
    (out / "table.json").write_text(json.dumps(table, indent=2) + "\n")
    (out / "table.md").write_text(markdown(table) + "\n")
    log(markdown(table))
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attention_course.wave", description=__doc__.split("\n\n")[0])
    p.add_argument("wave", nargs="?", help="the wave file (TOML), e.g. course_tools/waves/wave1.toml")
    p.add_argument("--out", help="where the runs and the table go")
    p.add_argument("--smoke", action="store_true", help="the same runs, tiny: toy corpus, one-layer model, 6 steps")
    p.add_argument("--only", action="append", metavar="RUN", help="only this run (repeatable)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if available)")
    p.add_argument("--mirror", default=None, help="folder with the Multi30k raw files (default: $ATTN_MULTI30K_MIRROR)")
    p.add_argument("--max-seconds", type=float, default=None, help="every run's training budget (overrides the file)")
    p.add_argument("--deadline", type=float, default=None, help="the whole wave's wall clock (overrides the file)")
    p.add_argument("--poll", type=float, default=15.0, help="seconds between progress lines")
    p.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)   # one run, in its own process
    args = p.parse_args(argv)
    if args.worker:
        run_one(Path(args.worker))
        return 0
    if not args.wave or not args.out:
        p.error("give a wave file and --out DIR")
    try:
        wave = load_wave(args.wave, smoke=args.smoke, only=args.only)
        mirror = str(Path(args.mirror).resolve()) if args.mirror else None
        if args.max_seconds is not None:
            wave = replace(wave, max_seconds=args.max_seconds)
        if args.deadline is not None:
            wave = replace(wave, deadline=args.deadline)
        for run in wave.runs:
            wave.config(run)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as err:
        print(f"wave: {err}", file=sys.stderr)
        return 2
    table = launch(wave, args.out, device=args.device, mirror=mirror, poll=args.poll)
    return 0 if table["totals"]["finished"] == table["totals"]["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
