"""The identities of the records of an out_dir: `<out_dir>/identities.json`, the sidecar index
the leaderboard, the claims and the suite runner read (`python -m bench identities` writes it).

A record's identity is that of its config (task, model and trainer settings, the result-neutral
trainer keys aside: `config_key`) under its code version (records.code_digest), as
bench/reports/identity.py measures it: computed once per (code version, config) in a checkout of the
commit that made the record (`git archive` of its code into a temporary folder), so records are
never rewritten. Records of a dirty checkout, of unknown code, or of another torch than the
index's have none: nobody can rebuild the code they ran.

The index is a cache of a deterministic computation and is verified before it is used: it
carries a digest of its content, and a file that does not match (edited by hand, damaged) is
ignored with a warning, never trusted."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench.config import family_schema
from bench.config.formats import plural
from bench.records import store
from bench.records.store import (CODE_PATHS, IDENTITY_INDEX, REPO, code_digest, not_a_regular_file,
                                 read_records, with_defaults)
from bench.reports import identity as probe_module
from tasks.files import write_atomic

INDEX_NAME = IDENTITY_INDEX
INDEX_FORMAT = "icl-bench/identities/1"
# The script name the probe runs under in a checkout (not "identity.py" beside bench/'s
# modules, whose names would shadow others on sys.path)
SCRIPT_NAME = "icl_identity_probe.py"
PROBE_TIMEOUT_S = 1800  # one checkout's probes; a hang must not hold a suite for ever


def resolved_config(record: dict, group: str) -> dict:
    """The record's task, model or trainer config with the fields added after it was written at
    their defaults, so a config field added later does not split a section or a row in two."""
    family = "default" if group == "trainer" else record[group].get("family")
    return with_defaults(record[group]["config"], family_schema(group, family))


# The trainer keys a config key leaves out: RESULT_NEUTRAL as it was when the index was first
# keyed. Keys that joined RESULT_NEUTRAL since (val_every, val_sequences) stay in the key, so no
# stored probe loses its key; runs that differ only in them pool on the leaderboard anyway.
IDENTITY_NEUTRAL = ("progress", "threads", "eval_batch_size", "log_every", "checkpoint_every",
                    "logger", "loader_workers", "save_weights")


# Trainer and model fields added after records were indexed, left out of the key at their
# default (what those records ran): a new field must not change the key of every config made
# before it.
KEY_OMITS_AT_DEFAULT = {"accumulate_grad_batches": 1, "compile_mode": "default",
                        "fused_adamw": False}
MODEL_KEY_OMITS_AT_DEFAULT = {"transformer": {"norm": True}, "gd_ssm": {"features": 0}}


def _without_defaults(config: dict, omits: dict) -> dict:
    return {k: v for k, v in config.items() if not (k in omits and v == omits[k])}


def config_key(record: dict) -> str:
    """What a record's identity is the identity of: its task and model (family and resolved
    config) and its trainer settings but the result-neutral ones; not the seed (the probe runs
    seed 0), not the names (a preset's name changes nothing it runs)."""
    trainer = _without_defaults({k: v for k, v in resolved_config(record, "trainer").items()
                                 if k not in IDENTITY_NEUTRAL}, KEY_OMITS_AT_DEFAULT)
    family = record["model"].get("family")
    model = _without_defaults(resolved_config(record, "model"),
                              MODEL_KEY_OMITS_AT_DEFAULT.get(family, {}))
    described = [record["task"].get("family"), resolved_config(record, "task"), family, model,
                 trainer]
    return hashlib.sha1(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def spec_of(record: dict, resolved: bool) -> dict:
    """The probe's input for a record's config: as recorded (for the code that made it, whose
    schema it is) or resolved (for today's code, which fills fields added since)."""
    def section(group: str) -> dict:
        config = resolved_config(record, group) if resolved else record[group]["config"]
        return {**{k: v for k, v in record[group].items() if k != "config"}, "config": config}
    return {"key": config_key(record), "task": section("task"), "model": section("model"),
            "trainer": section("trainer")}


def record_code(record: dict) -> tuple[str | None, str | None, str]:
    """(code digest, commit, why not) of the code a record ran: none where that code cannot be
    rebuilt (a dirty checkout, no commit recorded, a commit this repository does not have)."""
    prov = record.get("provenance")
    prov = prov if isinstance(prov, dict) else {}
    commit = prov.get("commit") if isinstance(prov.get("commit"), str) else None
    if not commit:
        return None, None, "no commit recorded"
    if not store.is_object_name(commit):
        return None, None, "its commit is not a full commit hash"
    if prov.get("dirty") is not False:
        return None, commit, "made by a dirty checkout" if prov.get("dirty") else \
            "not known whether the checkout was clean"
    code = prov.get("code") if isinstance(prov.get("code"), str) else None
    code = code or code_digest(commit)
    if not code:
        return None, commit, f"commit {commit[:7]} is not in this repository"
    return code, commit, ""


def torch_of(record: dict) -> str | None:
    prov = record.get("provenance")
    version = prov.get("torch") if isinstance(prov, dict) else None
    return version if isinstance(version, str) else None


def probe_machine() -> str:
    """What a probe's floats depend on beyond the code and torch: the CPU's vector instructions
    as torch uses them and its model (MKL and oneDNN take other code paths on another vendor's
    CPU). Measured: the same code probed on an AMD EPYC with AVX512 and on the machine of the
    earlier sessions differs beyond TOLERANCE in 25 of 136 configs (optimizer steps by 1e-5), so
    identities are compared only between probes of one machine."""
    import torch
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info
                          if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{torch.backends.cpu.get_cpu_capability()} {model}"


def reproduces(old: dict, new: dict) -> bool:
    """Whether the probe result `new` (today's code) reproduces `old` (an older code's) for one
    config: every number old measured agrees (bench.reports.identity.agrees)."""
    return not differing_parts(old, new)


def differing_parts(old: dict, new: dict) -> list[str]:
    return [part for part in probe_module.PARTS
            if probe_module.differing(old["parts"].get(part, {}), new["parts"].get(part, {}))]


@dataclass
class Index:
    """code digest -> {"commit": the commit its identities were computed at, "torch": the torch
    they were computed with, "machine": where (probe_machine; absent in indexes before it), "probe":
    the probe's format (bench.reports.identity.FORMAT), "configs":
    {config key: probe result,
    or {"error": why}}}; `today`: the code digest of this checkout, when clean; `reference`: the
    code whose identities records pool by (pooling_code: today's, or the nearest probed)."""
    path: Path
    codes: dict[str, dict] = field(default_factory=dict)
    command: str = ""
    today: str | None = None
    reference: str | None = None

    def entry(self, code: str | None, key: str) -> dict | None:
        found = (self.codes.get(code) or {}).get("configs", {}).get(key) if code else None
        return found if found and "identity" in found else None

    def own(self, record: dict) -> dict | None:
        """The probe result of the record's config under the code that made it, or None where
        it is not known (not computed, not computable, or the record ran another torch)."""
        if not self.codes:
            return None
        code = record_code(record)[0]
        found = self.entry(code, config_key(record))
        if found is None or torch_of(record) not in (None, self.codes[code].get("torch")):
            return None  # another torch drew other random streams than the probe's
        return found

    def version(self, record: dict) -> tuple[str | None, bool]:
        """(what the record pools by, whether that is today's): the reference code's identity
        of its config (today's, unless set otherwise) when that code reproduces the record's
        own, else its own; (None, False) where unknown."""
        own = self.own(record)
        if own is None:
            return None, False
        reference = self.reference or self.today
        now = self.entry(reference, config_key(record))
        same_machine = (self.codes[reference].get("machine") ==
                        self.codes[record_code(record)[0]].get("machine")) if now else False
        if now is not None and same_machine and reproduces(own, now):
            return now["identity"], reference == self.today
        return own["identity"], False

    def is_current(self, record: dict) -> bool:
        """Whether today's code reproduces what the record's code does with its config."""
        return self.version(record)[1]

    def identity(self, record: dict) -> str | None:
        return self.version(record)[0]


def probe_format() -> str:
    """What the probe measures, as its format version (bench.reports.identity.FORMAT, bumped when a
    measurement changes): identities measured by another format are not compared. Not a digest
    of the probe's file: moving it, or editing a comment, leaves every stored identity usable."""
    return probe_module.FORMAT


def content_digest(codes: dict) -> str:
    return hashlib.sha256(json.dumps(codes, sort_keys=True).encode()).hexdigest()


def load_index(out_dir: str | Path, today: str | None = None, quiet: bool = False) -> Index:
    """The index of out_dir, comparing with the code digest `today`; empty when there is none,
    or when the file cannot be trusted (not a regular file, unreadable, another format, content
    not matching its digest: then a warning)."""
    path = Path(out_dir) / INDEX_NAME
    index = Index(path, today=today)
    if not os.path.lexists(path):
        return index
    problem = not_a_regular_file(path)
    data = None
    if not problem:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError, UnicodeDecodeError, RecursionError) as error:
            problem = f"unreadable ({type(error).__name__})"
    if data is not None:
        if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
            problem = "not an identity index of this format"
        elif not isinstance(data.get("codes"), dict) or \
                data.get("digest") != content_digest(data["codes"]):
            problem = "altered (its content does not match the digest it was written with)"
    if problem:
        if not quiet:
            print(f"warning: the identity index {path} is {problem}; ignored (python -m bench "
                  f"identities out_dir={out_dir} computes it again)", file=sys.stderr)
        return index
    index.codes, index.command = data["codes"], str(data.get("command", ""))
    return index


def save_index(index: Index, command: str) -> Path:
    data = {"format": INDEX_FORMAT, "command": command,
            "note": "written by `python -m bench identities`; do not edit "
                    "(bench/reports/identities.py)",
            "digest": content_digest(index.codes), "codes": index.codes}
    # one line per code version: compact, and a diff shows which versions changed
    codes = ",\n".join(f"{json.dumps(code)}: {json.dumps(slot, sort_keys=True, separators=(',', ':'))}"
                       for code, slot in sorted(index.codes.items()))
    head = json.dumps({k: v for k, v in data.items() if k != "codes"}, sort_keys=True)[:-1]
    write_atomic(index.path, lambda tmp: Path(tmp).write_text(
        f"{head}, \"codes\": {{\n{codes}\n}}}}\n"))
    return index.path


def run_probes(tree: Path, specs: list[dict], log=None) -> dict[str, dict]:
    """Probe results {config key: result} of specs under the code of `tree` (a checkout): the
    specs dealt out among probe processes, one a core (each probe runs on one thread, seed 0,
    so where it runs moves none of its numbers), each with that checkout first on the path."""
    if not specs:
        return {}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    processes = min(len(specs), cores or 1)
    parts = [specs[start::processes] for start in range(processes)]
    results: dict[str, dict] = {}
    lock = threading.Lock()

    def logged(key: str, result: dict) -> None:
        with lock:
            results[key] = result
            if log is not None:
                log(key, result)

    with tempfile.TemporaryDirectory(prefix="icl-identity-script-") as folder:
        script = Path(folder) / SCRIPT_NAME
        shutil.copyfile(probe_module.__file__, script)
        threads = [threading.Thread(target=_probe_process, args=(tree, script, part, logged,
                                                                 Path(folder) / f"stderr{i}.txt"))
                   for i, part in enumerate(parts)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return results


def _probe_process(tree: Path, script: Path, specs: list[dict], logged, stderr_path: Path) -> None:
    """One probe process for specs, under the code of `tree`: logged(key, result) for each
    result it prints; a process that dies names the last thing it said for its specs left."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    done = set()
    # stderr to a file: a pipe nobody reads until the end would stall a chatty probe
    with open(stderr_path, "w+") as stderr:
        process = subprocess.Popen([sys.executable, str(script)], cwd=str(tree), env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                   text=True)
        # a probe that hangs is killed: its configs, and those after it, are named not computed
        watchdog = threading.Timer(PROBE_TIMEOUT_S, process.kill)
        watchdog.start()
        try:
            process.stdin.write(json.dumps(specs))
            process.stdin.close()
            for line in process.stdout:
                try:
                    result = json.loads(line)
                except ValueError:
                    continue
                key = result.pop("key", None)
                if key is not None:
                    done.add(key)
                    logged(key, result)
            process.wait()
        finally:
            watchdog.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
            stderr.seek(0)
            error = stderr.read().strip().splitlines()
    for spec in specs:
        if spec["key"] not in done:
            logged(spec["key"], {"error": "the probe process ended early: "
                                          f"{error[-1] if error else 'no message'}"})


def export_commit(commit: str, folder: Path) -> None:
    """The code of `commit` (CODE_PATHS) written into folder, as `git archive` gives it."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "--",
                              *CODE_PATHS], capture_output=True, timeout=120)
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {commit[:7]} failed: "
                           f"{archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True,
                   timeout=120)


def fill(index: Index, wanted: dict[str, dict[str, dict]], commits: dict[str, str],
         torch_version: str, current: tuple[str, str] | None = None, log=None,
         machine: str | None = None) -> int:
    """Compute the index's missing entries: `wanted` maps code digest -> {config key: spec},
    `commits` code digest -> a commit of that code; `current`: (code digest, commit) of this
    checkout, probed in place. Returns the number of probes run."""
    ran = 0
    machine = machine or probe_machine()
    for code, specs in wanted.items():
        slot = index.codes.get(code)
        if slot is None or (slot.get("torch"), slot.get("probe"), slot.get("machine")) != (
                torch_version, probe_format(), machine):
            slot = index.codes[code] = {"commit": commits[code], "torch": torch_version,
                                        "machine": machine, "probe": probe_format(),
                                        "configs": {}}
        missing = [spec for key, spec in specs.items() if key not in slot["configs"]]
        if not missing:
            continue
        if current is not None and code == current[0]:
            results = run_probes(REPO, missing, log)
        else:
            with tempfile.TemporaryDirectory(prefix=f"icl-identity-{code}-") as folder:
                try:
                    export_commit(commits[code], Path(folder))
                    results = run_probes(Path(folder), missing, log)
                except (RuntimeError, OSError, subprocess.SubprocessError) as error:
                    results = {spec["key"]: {"error": str(error)} for spec in missing}
        slot["configs"].update(results)
        ran += len(missing)
    return ran


def fill_current(index: Index, records: list[dict], today: tuple[str, str]) -> int:
    """Today's identities of the records' configs that the index lacks, computed and saved
    (a suite deciding which entries are done); the number computed."""
    import torch
    wanted = {today[0]: {config_key(r): spec_of(r, resolved=True) for r in records
                         if index.entry(today[0], config_key(r)) is None}}
    if not wanted[today[0]]:
        return 0
    ran = fill(index, wanted, {today[0]: today[1]}, torch.__version__, today)
    try:
        save_index(index, f"python -m bench identities out_dir={index.path.parent}")
    except OSError as error:  # an unwritable index costs the next suite the probes again
        print(f"warning: {index.path} not written ({error})", file=sys.stderr)
    return ran


def pooling_code(index: Index) -> str | None:
    """The code whose identities records pool by: this checkout's HEAD where the index has
    probed it (today's, or, in a dirty tree, what the tree was before the edit), else the probed
    code nearest HEAD in its history. Pooling, and so every verdict, then stays what the last
    `identities` run made it until the next one, through any commit or edit in between; only
    the `current` labels wait for that run. None without git or a probed ancestor."""
    here = store.provenance().get("code")
    if here in index.codes:
        return here
    by_commit = {slot.get("commit"): code for code, slot in index.codes.items()}
    return next((by_commit[c] for c in store.ancestors() if c in by_commit), None)


def current_code() -> tuple[str, str] | None:
    """(code digest, commit) of this checkout when its result-shaping code is clean."""
    here = store.provenance()  # looked up at the call: tests stand in other code versions
    if not here["code"] or here["dirty"] is not False:
        return None
    return here["code"], here["commit"]


@dataclass
class Status:
    """Each record's standing under today's code: `current` (today's code reproduces its
    identity), `stale` ({code: (parts that differ, records)}) or `unknown` ({why: records})."""
    current: list[dict] = field(default_factory=list)
    stale: dict[tuple, list[dict]] = field(default_factory=lambda: defaultdict(list))
    unknown: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))


def standing(index: Index, records: list[dict]) -> Status:
    status = Status()
    for record in records:
        code, _, why = record_code(record)
        key = config_key(record)
        mine = (index.codes.get(code) or {}).get("configs", {}).get(key)
        now = (index.codes.get(index.today) or {}).get("configs", {}).get(key)
        if why:
            status.unknown[why].append(record)
        elif index.today is None:
            status.unknown["today's code is dirty or unknown"].append(record)
        elif mine is None or now is None:
            status.unknown["identity not computed (python -m bench identities)"].append(record)
        elif "error" in mine or "error" in now:
            which = mine if "error" in mine else now
            where = "its code" if "error" in mine else "today's code"
            status.unknown[f"probe failed under {where}: {which['error']}"].append(record)
        elif index.own(record) is None:
            status.unknown["made with another torch than the probe's"].append(record)
        elif index.is_current(record):
            status.current.append(record)
        else:
            status.stale[tuple(differing_parts(mine, now))].append(record)
    return status


def wanted_probes(records: list[dict], today: tuple[str, str] | None
                  ) -> tuple[dict[str, dict[str, dict]], dict[str, str]]:
    """({code digest: {config key: spec}}, {code digest: commit}): every record's config under
    its own code, and under today's code (`today`) too."""
    wanted: dict[str, dict[str, dict]] = defaultdict(dict)
    commits: dict[str, str] = {}
    for record in records:
        code, commit, why = record_code(record)
        if not why:
            wanted[code].setdefault(config_key(record), spec_of(record, resolved=False))
            commits.setdefault(code, commit)
        if today is not None:
            wanted[today[0]].setdefault(config_key(record), spec_of(record, resolved=True))
            commits[today[0]] = today[1]
    return wanted, commits


def ok_records(out_dir: str | Path, warn: bool = False) -> list[dict]:
    """The ok records of out_dir that have a config key; warn: a line on stderr naming each
    file left out as unusable (as the leaderboard's and claims' warnings do)."""
    found, bad = read_records(out_dir)
    usable = []
    for record in found:
        try:
            if record.get("status") == "ok":
                config_key(record)
                usable.append(record)
        except (KeyError, TypeError, AttributeError) as error:  # a malformed record: no config
            bad.append((record["_path"], f"no config key ({type(error).__name__}: {error})"))
    for path, reason in bad if warn else ():
        print(f"warning: skipped {path}: {reason}", file=sys.stderr)
    return usable


def summary_lines(status: Status, today: tuple[str, str] | None) -> list[str]:
    label = today[1][:7] if today else "unknown"
    lines = [f"current under today's code ({label}): {plural(len(status.current), 'record')}"]
    for parts, records in sorted(status.stale.items(), key=lambda kv: -len(kv[1])):
        commits = sorted({record_code(r)[1][:7] for r in records})
        lines.append(f"stale: {plural(len(records), 'record')}, {', '.join(parts)} differ "
                     f"(made at {', '.join(commits)})")
    for why, records in sorted(status.unknown.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"not computable: {plural(len(records), 'record')}, {why}")
    return lines


def report_identities(out_dir: str, check: bool = False) -> int:
    """`python -m bench identities`: fill out_dir's index, say which records are current."""
    import torch
    records = ok_records(out_dir, warn=True)
    index = load_index(out_dir)
    today = current_code()
    if today is None:
        print("warning: the code of this checkout (bench/, tasks/, models/, conf/, "
              "pyproject.toml) differs from its commit, or git cannot tell: today's identities "
              "are not computed (commit first)", file=sys.stderr)
    here = (torch.__version__, probe_format(), probe_machine())
    for code in [c for c, slot in index.codes.items()
                 if (slot.get("torch"), slot.get("probe"), slot.get("machine")) != here]:
        # probed with another torch (other random streams), probe, or on another machine (other
        # float rounding): probed again here, so that every identity compared is of one machine
        del index.codes[code]
    wanted, commits = wanted_probes(records, today)
    command = f"python -m bench identities out_dir={out_dir}"
    if check:
        return check_index(index, wanted, today, command)
    total = sum(len(specs) - len((index.codes.get(code) or {}).get("configs", {}).keys()
                                 & specs.keys()) for code, specs in wanted.items())
    done = [0]
    start = time.perf_counter()

    def log(key: str, result: dict) -> None:
        done[0] += 1
        what = result.get("identity") or result.get("error")
        print(f"[{done[0]}/{total}] {key}: {what} ({result.get('seconds', 0)} s)",
              file=sys.stderr, flush=True)

    ran = fill(index, wanted, commits, torch.__version__, today, log)
    for code in set(index.codes) - set(wanted):  # no record's code, nor today's: not kept
        del index.codes[code]
    path = save_index(index, command)
    print(f"{path}: {plural(len(records), 'record')}, {plural(ran, 'probe')} run in "
          f"{time.perf_counter() - start:.0f} s")
    index.today = today[0] if today else None
    for line in summary_lines(standing(index, records), today):
        print(line)
    return 0


def check_index(index: Index, wanted: dict, today: tuple[str, str] | None,
                command: str) -> int:
    """identities check=true: today's identities computed again must equal the index's."""
    if today is None or today[0] not in index.codes:
        print(f"error: the index holds no identities of today's code; {command} computes them",
              file=sys.stderr)
        return 1
    import torch
    stored = index.codes[today[0]]["configs"]
    fresh = Index(index.path)
    fill(fresh, {today[0]: {k: s for k, s in wanted[today[0]].items() if k in stored}},
         {today[0]: today[1]}, torch.__version__, today)
    differ = {}
    for key, result in fresh.codes[today[0]]["configs"].items():
        if "error" in result or "error" in stored[key]:
            differ[key] = "a probe failed"
        elif not (reproduces(stored[key], result) and reproduces(result, stored[key])):
            differ[key] = ", ".join(differing_parts(stored[key], result)) + " differ"
    for key, why in differ.items():
        print(f"error: config {key}: the index's identity is not reproduced ({why})",
              file=sys.stderr)
    print(f"{len(stored)} identities of today's code checked: {len(differ)} differ")
    return 1 if differ else 0
