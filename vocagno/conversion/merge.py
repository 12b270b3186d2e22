"""The last step of a conversion: the parts its jobs made joined into one dataset, with the summary of what was
converted.

``merge`` (run by the last job to finish, or ``--merge-only``) reads the jobs' markers and the parts' counts back from
the out-root (files from elsewhere), adds the counts up (``add_part_stats``), and publishes the dataset
(``vocagno/data/outroots.py``: every shard verified on the out-root, ``vocagno.json`` and ``index.json`` written
atomically), or publishes nothing when too little was converted (``REFUSED_FILE`` records why). ``print_summary``
prints a job's or the dataset's counts.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from vocagno.conversion.parts import FIELD_SETS, FIELDS, FOLDED, NOT_COUNTS, OTHER_FIELDS, TAIL, part_stats
from vocagno.data.outroots import Output, job_marker, merge_once, part_index, publish_dataset, unfinished_parts
from vocagno.data.shards import ShardMetadata, TokenizerInfo
from vocagno.doors.untrusted import UntrustedFile, plain_name, read_json
from vocagno.doors.writing import remove, write_atomically
from vocagno.errors import Refused
from vocagno.shown import terminal

__all__ = ["CONFIG_FILE", "REFUSED_FILE", "merge", "add_part_stats", "bound_field_sets", "print_summary"]

CONFIG_FILE = "conversion.json"  # a conversion's settings on its out-root: a resumed run must use the same
REFUSED_FILE = "refused.json"  # what the last merge left when it published nothing
NAMED = 20  # documents over the cap named in a summary (a job's marker names them all)


def _job(output: Output, marker: str) -> dict:
    """A finished job's marker (its parts, the files it could not read, its documents over the cap), refused unless
    it holds those as a converting job writes them."""
    where = f"{output}/{marker}"
    job = read_json(marker, folder=output.local)
    if not (isinstance(job, dict) and isinstance(job.get("parts"), list)
            and isinstance(job.get("unreadable", {}), dict) and isinstance(job.get("over_cap", []), list)
            and all(isinstance(v, str) for v in [*job.get("unreadable", {}).values(), *job.get("over_cap", [])])):
        raise UntrustedFile(f"{where}: refused: not a job's record of its parts")
    job["parts"] = [plain_name(p, where, "part name") for p in job["parts"]]
    return job


def add_part_stats(totals: Counter, stats: dict) -> None:
    """Add a part's counts (its ``part_stats``) to ``totals``."""
    totals.update({k: v for k, v in stats.items() if k not in NOT_COUNTS})  # counts add up; a part's seconds don't


def bound_field_sets(totals: Counter) -> None:
    """At most ``FIELD_SETS`` sets of fields kept of all the parts' (the most frequent), the others' records counted
    together, so a corpus whose records each have other fields keeps the summary, the refusal and vocagno.json small
    (the parts' own, FIELD_SETS each, are added up first)."""
    sets = sorted((k for k in totals if k.startswith(FIELDS)), key=lambda k: (k == OTHER_FIELDS, -totals[k], k))
    for key in [k for k in sets if k != OTHER_FIELDS][FIELD_SETS:]:
        totals[OTHER_FIELDS] += totals.pop(key)


def merge(output: Output, args: argparse.Namespace) -> int:
    """Join the finished parts into one dataset. Jobs that end together merge once: the first takes the lock."""
    merged = merge_once(output, lambda: _merge(output, args))
    return 0 if merged is None else merged  # None: a live job is merging: it publishes the dataset


def _merge(output: Output, args: argparse.Namespace) -> int:
    root = output.local
    if not output.fetch(CONFIG_FILE):
        raise Refused(f"cannot merge {output}: no conversion was started there")
    config = read_json(CONFIG_FILE, folder=root)
    if not (isinstance(config, dict) and isinstance(config.get("seq_len"), int)
            and all(isinstance(config.get(side), dict) for side in ("student", "teacher"))):
        raise UntrustedFile(f"{output}/{CONFIG_FILE}: refused: not the settings a vocagno conversion records")
    markers = {i: f"{job_marker(i, args.num_jobs)}.json" for i in range(args.num_jobs)}
    done = [i for i, marker in markers.items() if output.pull(marker)]
    unfinished = [i for i in markers if i not in done]
    if not done or (unfinished and not args.allow_partial):
        raise Refused(
            f"cannot merge {output}: job(s) {unfinished} of {args.num_jobs} have not finished; run them (the "
            "same command with their --job-index), or add --allow-partial to publish what the others made"
        )
    jobs = {markers[i]: _job(output, markers[i]) for i in done}
    parts = sorted({p for job in jobs.values() for p in job["parts"]})
    unreadable = {name: error for job in jobs.values() for name, error in job.get("unreadable", {}).items()}
    over_cap = [where for job in jobs.values() for where in job.get("over_cap", [])]
    missing = unfinished_parts(output, parts)
    if missing:
        raise Refused(f"cannot merge {output}: parts not finished there: {missing}")
    totals = Counter()
    for part in parts:
        add_part_stats(totals, part_stats(output, part))
    bound_field_sets(totals)
    totals["unreadable files"] = len(unreadable)
    too_little = _too_little(totals, args.min_converted, config["seq_len"])
    if too_little:
        print_summary("dataset (not published)", totals, output, parts, unreadable=unreadable, over_cap=over_cap)
        if output.fetch("index.json"):  # a dataset published before stays as it is
            raise Refused(f"nothing merged into {output}: {too_little}; its published dataset stays")
        # Recorded with the settings and jobs it refused: a single job's rerun there with other options starts
        # afresh; one with the same options (a lower --min-converted) merges these parts.
        fresh = output.remote is None and args.num_jobs == 1
        if fresh:
            write_atomically(root / REFUSED_FILE, json.dumps({"why": too_little, "num_jobs": args.num_jobs,
                                                              "settings": config}))
        rerun = ("the same command with corrected options starts afresh there (a corrected input file: delete "
                 f"{output} first)" if fresh else
                 f"its parts stay on {output}: delete them, or give another --out-root, to convert with other options")
        raise Refused(f"nothing published to {output}: {too_little}; {rerun}")
    metadata = ShardMetadata(
        student=TokenizerInfo(**config["student"]),
        teacher=TokenizerInfo(**config["teacher"]),
        seq_len=config["seq_len"],
        totals=dict(totals),
        partial={"jobs_done": done, "num_jobs": args.num_jobs} if unfinished else None,
    )
    publish_dataset(output, parts, metadata)
    if (root / REFUSED_FILE).exists():  # an earlier merge's refusal of the same parts, now published
        remove(root / REFUSED_FILE)
    print_summary("dataset", totals, output, parts, merged=True, unreadable=unreadable, over_cap=over_cap)
    if unfinished:
        print(f"PARTIAL: jobs {unfinished} of {args.num_jobs} had not finished (--allow-partial; vocagno.json says so)")
    return 1 if unreadable else 0


def _too_little(totals: Counter, min_converted: float, seq_len: int) -> str | None:
    """Why the converted data is too little to publish, or None."""
    read, converted = totals["documents read"], totals["documents converted"]
    skipped = ", ".join(f"{k.removeprefix('skipped: ')}: {v:,}" for k, v in totals.most_common() if k.startswith("skipped"))
    if read == 0:
        return "the input holds no documents"
    if converted < min_converted * read:
        hint = ("; --text-field NAME names the field holding the text (--text-template joins several)"
                if any(k.startswith("skipped: missing ") for k in totals) else "")
        fields = "; ".join(f"{k.removeprefix(FIELDS)}: {v:,}" for k, v in totals.most_common() if k.startswith(FIELDS))
        fields = f" (the records without it have the fields: {fields})" if fields else ""
        return (f"only {converted:,} of {read:,} documents converted (--min-converted {min_converted}); skipped: "
                f"{skipped or 'none'}{fields}{hint}")
    if totals["samples"] == 0:
        return (f"{converted:,} documents converted, but their {totals['student tokens']:,} student tokens make no "
                f"sample of --seq-len {seq_len} (fewer than that per part)")
    return None


def print_summary(title: str, totals: Counter, output: Output, parts: list[str], merged: bool = False,
                  unreadable: dict[str, str] | None = None, over_cap: list[str] | None = None) -> None:
    """The counts of ``totals``, the files that could not be read and the documents skipped as over the document
    cap (by file and line: the first ``NAMED``, then how many more)."""
    shard_bytes = 0
    for part in parts:
        for shard in part_index(output.local, part, output)["shards"]:
            shard_bytes += (shard.get("zip_data") or shard["raw_data"])["bytes"]
    tokens = totals["student tokens"]
    lines = [
        f"--- summary: {title} ({len(parts)} parts) ---",
        f"documents read:        {totals['documents read']:,}",
        f"documents converted:   {totals['documents converted']:,}",
    ]
    lines += [f"  {k}: {v:,}" for k, v in sorted(totals.items()) if k.split(":")[0] in ("skipped", "repaired", "kept")]
    lines += [f"    {k}: {v:,}" for k, v in totals.most_common() if k.startswith(FIELDS)][:NAMED]
    over_cap = over_cap or []
    lines += [f"    skipped, over the document cap: {where}" for where in over_cap[:NAMED]]
    if len(over_cap) > NAMED:
        lines.append(f"    ... and {len(over_cap) - NAMED:,} more (all named in the job-*.json files on the out-root)")
    lines += [
        f"samples:               {totals['samples']:,}",
        f"student tokens:        {tokens:,}",
        f"teacher tokens:        {totals['teacher tokens']:,}",
        f"{TAIL}: {totals[TAIL]:,}",
        f"{FOLDED}: {totals[FOLDED]:,}",
        f"bytes on disk (shards): {shard_bytes:,}"
        + (f" = {shard_bytes / tokens:.2f} bytes per student token" if tokens else ""),
    ]
    lines += [f"UNREADABLE: {name}: {error}" for name, error in (unreadable or {}).items()]
    if merged:
        lines.append(f"complete: {output} (index.json, vocagno.json)"
                     + (f", without the {len(unreadable)} unreadable file(s) above" if unreadable else ""))
    print("\n".join(terminal(line) for line in lines), flush=True)  # file names and errors: a corpus's
