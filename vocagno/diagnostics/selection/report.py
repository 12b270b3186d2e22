"""The selection report rendered: the terminal table, the JSON, the HTML page (``Report``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


from vocagno.diagnostics.canaries import CLEAN
from vocagno.shown import html_text, terminal
from vocagno.diagnostics.selection.settings import BINS, Settings

__all__ = ["FLAT_STUDENT", "NO_SEPARATION", "Report", "SEPARATES", "Verdict"]

# The verdict's thresholds on the lift (the top-k's precision less the clean share, what a random selection keeps),
# from the miniature's evidence (docs/selection.md#the-verdict): the top 40% whose students beat plain continual
# pretraining beyond twice the spread over seeds kept 0.703 against a clean share of 0.512 (+0.19); the shipped
# teacher keeps +0.19 to +0.21 over it; a random 40% (a lift of 0) did no better than plain, and a random selection's
# precision lies within 0.03 of the clean share on 64 rows, so a lift under +0.05 is not told apart from chance.
SEPARATES = 0.15  # at or above: guidance helped wherever the miniature measured a lift this large
NO_SEPARATION = 0.05  # below: no better than a random selection, which never helped
FLAT_STUDENT = "at initialization"  # how a report names the default student, ln V for every token
CHUNK_BETTER = 0.05  # a chunk-level variant this much more precise than the top-k: the noise comes in whole stretches


@dataclass
class Verdict:
    """Whether the teacher separates the corpus's useful tokens enough for guidance to help (``level``: separates,
    weak, does not separate, or no verdict), why (``line``), and what to try otherwise (``advice``)."""

    level: str
    line: str
    advice: list[str] = field(default_factory=list)
    lift: float | None = None


@dataclass
class Report:
    """What ``measure`` found; ``table()`` for the terminal, ``as_json()``, ``page()`` for ``--html``."""

    kinds: list[str]
    settings: Settings
    teacher: str
    student: str
    rows: int
    tokens: int
    mapped: int
    clean_share: float
    canaries: float
    variants: dict[str, dict[str, Any]]
    losses: dict[str, dict[str, float]]  # who -> kind -> mean loss per token (nats)
    kept_histogram: dict[str, list[int]]  # kind -> documents per bin of the top-k's kept fraction
    unmapped_kept: int
    dropped_tokens: int
    seconds: float = 0.0
    # several teachers: each one's top-k alone and its share of the combination's kept tokens, by name
    teachers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # several sources: per source, its rows, the combination's top-k and each teacher's alone, by source name
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    page_rows: list[dict] = field(default_factory=list, repr=False)

    def verdict(self) -> Verdict:
        """The verdict of the combination's top-k (``SEPARATES``, ``NO_SEPARATION``: docs/selection.md#the-verdict)
        against the clean share and against the teacher at initialization."""
        if self.mapped == 0:
            return Verdict("no verdict", "no verdict: no mapped student token to judge the teacher by (give rows "
                           "whose text both tokenizers map: more --samples, or other shards)")
        if self.canaries <= 0 or self.clean_share >= 1 or "topk" not in self.variants:
            return Verdict("no verdict", "no verdict without canaries: add --canaries 0.5 (a yaml's "
                           "selection_report.canaries), so the report can tell what the teacher keeps from noise")
        topk = self.variants["topk"]["precision"]
        lift = topk - self.clean_share
        untrained = self.variants.get("untrained_teacher", {}).get("precision")
        over_untrained = None if untrained is None else topk - untrained
        figures = f"its top-k keeps {topk:.3f} clean against a clean share of {self.clean_share:.3f} ({lift:+.3f})"
        advice = []  # the first, where it applies, is said of a teacher that separates too
        chunks = {n: v["precision"] for n, v in self.variants.items() if n.startswith("chunk_")}
        best = max(chunks, key=chunks.get) if chunks else None
        if best is not None and chunks[best] >= topk + CHUNK_BETTER:
            advice.append(f"{best} keeps cleaner text here ({chunks[best]:.3f}): the noise comes in whole stretches "
                          "of text, which a document filter or a chunk-level alignment catches better than tokens")
        if self.student.startswith(FLAT_STUDENT):
            advice.append("rank with a student that has trained on this corpus (--student CHECKPOINT of a plain run): "
                          "the score becomes its excess loss over the teacher's")
        advice.append("a teacher trained on this corpus's domain (in the two-teacher miniature the GSM8K teacher alone "
                      "cost the MATH text +0.79 bits per byte against plain training)")
        if lift >= SEPARATES and (over_untrained is None or over_untrained >= NO_SEPARATION):
            return Verdict("separates", f"the teacher separates this corpus's useful tokens: {figures}, at or above "
                           f"the +{SEPARATES:.2f} where guidance beat plain training in the miniature",
                           advice[:1] if advice[0].startswith("chunk_") else [], lift)
        if lift < NO_SEPARATION or (over_untrained is not None and over_untrained < NO_SEPARATION):
            why = (f"below the +{NO_SEPARATION:.2f} under which guidance did no better than plain in the miniature"
                   if lift < NO_SEPARATION else f"no better than the same teacher at initialization "
                   f"({untrained:.3f})")
            return Verdict("does not separate", f"the teacher does not separate this corpus's useful tokens: "
                           f"{figures}, {why}; expect no gain over plain training", advice + ["plain training: this teacher's guidance is unlikely to pay for its cost here"], lift)
        return Verdict("weak", f"the teacher separates this corpus's useful tokens weakly: {figures}, between "
                       f"+{NO_SEPARATION:.2f} and +{SEPARATES:.2f}, where the miniature measured no run; compare a "
                       "short guided run with a plain one before a long one", advice, lift)

    def as_json(self) -> dict[str, Any]:
        """The report as JSON values: a mean over no tokens (NaN) is None, as strict JSON has no NaN."""
        value = asdict(self)
        value.pop("page_rows")
        if not self.teachers:  # one teacher: the report as it has always been
            value.pop("teachers")
        if not self.sources:  # one source: the report as it has always been
            value.pop("sources")
        value["settings"] = asdict(self.settings)
        value["verdict"] = asdict(self.verdict())
        value["bins"] = [round(k / BINS, 2) for k in range(BINS + 1)]
        return _finite(value)

    def table(self) -> str:
        """The report for the terminal: each line through ``terminal`` (its names are the shards', a teacher's, a
        source's)."""
        noise = [k for k in self.kinds if k != CLEAN]
        lines = [
            f"what the teacher keeps: {self.rows} rows, {self.tokens:,} predicted student tokens ({self.mapped:,} "
            f"mapped), {self.canaries:.0%} canary documents ({', '.join(noise) or 'none'})",
            f"teacher: {self.teacher}; student: {self.student}",
            f"clean share of the mapped tokens: {self.clean_share:.3f} (what a random selection keeps)",
            "",
            f"{'variant':<20}{'precision':>10}{'recall':>8}   kept share of each kind's mapped tokens",
            f"{'':<20}{'':>10}{'':>8}   " + "  ".join(f"{k:>20}" for k in self.kinds),
        ]
        for name, row in self.variants.items():
            shares = "  ".join(f"{row['kept_share'][k]:>20.3f}" for k in self.kinds)
            lines.append(f"{name:<20}{row['precision']:>10.3f}{row['recall']:>8.3f}   {shares}")
        if self.teachers:
            lines += ["", f"{'each teacher alone':<20}{'precision':>10}{'recall':>8}   kept share of each kind's "
                      "mapped tokens; share of the topk's kept mapped tokens whose reference it gave"]
            for name, row in self.teachers.items():
                shares = "  ".join(f"{row['topk']['kept_share'][k]:>20.3f}" for k in self.kinds)
                lines.append(f"{name:<20}{row['topk']['precision']:>10.3f}{row['topk']['recall']:>8.3f}   {shares}"
                             f"   gave {row['share']:.3f}")
        if self.sources:
            lines += ["", f"{'per source':<20}{'precision':>10}{'recall':>8}   kept share of each kind's mapped "
                      "tokens; its rows, mapped tokens and clean share" + ("; each teacher's share of the topk's kept "
                                                                           "mapped tokens" if self.teachers else "")]
            for source, row in self.sources.items():
                shares = "  ".join(f"{row['topk']['kept_share'][k]:>20.3f}" for k in self.kinds)
                lines.append(f"{source:<20}{row['topk']['precision']:>10.3f}{row['topk']['recall']:>8.3f}   {shares}"
                             f"   {row['rows']} rows, {row['mapped']:,} mapped, clean {row['clean_share']:.3f}")
                for name, alone in row.get("teachers", {}).items():
                    shares = "  ".join(f"{alone['topk']['kept_share'][k]:>20.3f}" for k in self.kinds)
                    lines.append(f"  {name + ' alone':<18}{alone['topk']['precision']:>10.3f}"
                                 f"{alone['topk']['recall']:>8.3f}   {shares}   gave {alone['share']:.3f}")
        lines += ["", f"topk: {self.settings.describe()}; it keeps {self.unmapped_kept:,} unmapped tokens besides"
                  if self.settings.unmapped == "include" else f"topk: {self.settings.describe()}", "",
                  f"{'mean loss per token (nats)':<28}" + "".join(f"{k:>22}" for k in self.kinds)]
        for who, by_kind in self.losses.items():
            lines.append(f"{who:<28}" + "".join(f"{by_kind.get(k, float('nan')):>22.3f}" for k in self.kinds))
        lines += ["", "documents by the fraction of their mapped tokens the topk keeps:"]
        edges = [f"{k / BINS:.1f}" for k in range(BINS)]
        lines.append(f"{'':<22}" + "".join(f"{e:>6}" for e in edges) + "   (bins from)")
        for kind, counts in self.kept_histogram.items():
            lines.append(f"{kind:<22}" + "".join(f"{c:>6}" for c in counts))
        if self.dropped_tokens:
            lines.append(f"({self.dropped_tokens} student tokens after the last whole row were dropped, as the "
                         "converter drops them)")
        verdict = self.verdict()
        lines += [""] + [f"try: {a}" for a in verdict.advice] + [f"verdict: {verdict.line}"]
        return "\n".join(terminal(line) for line in lines)

    def page(self, title: str) -> str:
        from vocagno.diagnostics.pages import script_json

        data = {"kinds": self.kinds, "rows": self.page_rows,
                "variants": {k: {"precision": v["precision"], "recall": v["recall"], "kept_share": v["kept_share"]}
                             for k, v in self.variants.items()},
                "clean_share": self.clean_share, "settings": self.settings.describe(), "teachers": list(self.teachers),
                "verdict": asdict(self.verdict())}
        return _PAGE.replace("__TITLE__", html_text(title)).replace("__DATA__", script_json(data))


def _finite(value):
    """``value`` with every non-finite float in it None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 15px/1.5 system-ui, sans-serif; margin: 2em; max-width: 75em; color: #222; }
h1 { font-size: 1.2em; } h2 { font-size: 1em; margin: 1.2em 0 .3em; color: #555; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: right; border-bottom: 1px solid #e5e7eb; }
th:first-child, td:first-child { text-align: left; }
.row { white-space: pre-wrap; font-family: ui-monospace, monospace; line-height: 2.2; word-break: break-all;
       border-left: 3px solid #cbd5e1; padding-left: .6em; margin-bottom: 1em; }
.tok { border-radius: 3px; padding: 1px 0; cursor: default; }
.dropped { opacity: .35; }
.kept { outline: 1px solid #111; }
.canary { text-decoration: underline wavy; text-decoration-thickness: 2px; }
.k1 { text-decoration-color: #7c3aed; } .k2 { text-decoration-color: #dc2626; } .k3 { text-decoration-color: #0891b2; }
.special { background: #444 !important; color: #fff; font-size: .75em; padding: 1px 3px; margin: 0 1px; }
.legend span { display: inline-block; padding: 0 .5em; margin-right: .5em; border-radius: 3px; }
.chart td { text-align: left; min-width: 14em; } .chart th { text-align: left; }
.bar { display: inline-block; height: .9em; vertical-align: middle; margin-right: .4em; border-radius: 2px; }
.k0bar { background: #16a34a; } .k1bar { background: #7c3aed; }
.k2bar { background: #dc2626; } .k3bar { background: #0891b2; }
#verdict { border: 2px solid; border-radius: 6px; padding: .5em 1em; margin: 1em 0; }
#verdict.separates { border-color: #16a34a; background: #f0fdf4; }
#verdict.weak { border-color: #d97706; background: #fffbeb; }
#verdict.does-not-separate { border-color: #dc2626; background: #fef2f2; }
#verdict.no-verdict { border-color: #94a3b8; background: #f8fafc; }
#verdict h2 { margin: 0 0 .3em; color: inherit; }
#info { position: sticky; top: 0; background: #f8fafc; border: 1px solid #cbd5e1; padding: .4em .8em; min-height: 1.5em; }
</style></head><body>
<h1>__TITLE__</h1>
<div id="verdict"></div>
<div id="summary"></div>
<h2>what each variant keeps of each kind of text (its share of the kind's mapped tokens)</h2>
<div id="chart"></div>
<h2>legend</h2>
<div class="legend" id="legend"></div>
<div id="info">Hover a token: its kind, the teacher's loss (aggregated over its teacher tokens), the student's, kept or dropped.</div>
<h2>rows</h2>
<div id="rows"></div>
<script>
const data = __DATA__;
const maxLoss = Math.max(1, ...data.rows.flatMap(r => r.tokens.map(t => t.teacher || 0)));
const colour = loss => loss === null || loss === undefined ? "#e5e7eb" :
  `hsl(${Math.round(120 * (1 - Math.min(loss / maxLoss, 1)))}, 70%, 78%)`;
function summary() {
  let rows = Object.entries(data.variants).map(([name, v]) =>
    `<tr><td>${name}</td><td>${v.precision.toFixed(3)}</td><td>${v.recall.toFixed(3)}</td></tr>`).join("");
  const box = document.getElementById("summary");
  box.innerHTML = `<p>topk: ${data.settings}. Clean share of the mapped tokens: ${data.clean_share.toFixed(3)}
    (what a random selection keeps).</p><table><tr><th>variant</th><th>precision</th><th>recall</th></tr></table>`;
  box.querySelector("table").insertAdjacentHTML("beforeend", rows);
  const legend = document.getElementById("legend");
  [["low teacher loss", colour(0)], ["high teacher loss", colour(maxLoss)], ["no teacher loss (unmapped)", colour(null)]]
    .forEach(([label, c]) => { const s = document.createElement("span"); s.style.background = c; s.textContent = label;
                               legend.appendChild(s); });
  const kept = document.createElement("span"); kept.className = "kept"; kept.textContent = "kept (outlined)";
  const dropped = document.createElement("span"); dropped.className = "dropped"; dropped.textContent = "dropped (faded)";
  legend.append(kept, dropped);
  data.kinds.slice(1).forEach((kind, i) => { const s = document.createElement("span");
    s.className = `canary k${i + 1}`; s.textContent = `canary: ${kind}`; legend.appendChild(s); });
  if (data.teachers.length) {  // several teachers: a toggle colours tokens by the one that gave their reference
    const label = document.createElement("label"), box = document.createElement("input");
    box.type = "checkbox"; box.id = "byTeacher"; box.onchange = () => { document.getElementById("rows").innerHTML = "";
      render(); };
    label.append(box, " colour by the teacher that gave the reference:");
    legend.appendChild(label);
    data.teachers.forEach((name, i) => { const s = document.createElement("span"); s.textContent = name;
      s.style.background = teacherColour(name); legend.appendChild(s); });
  }
}
const teacherColour = by => by === null || by === undefined ? "#e5e7eb" : by.includes("+") ? "#d4d4d8" :
  `hsl(${(data.teachers.indexOf(by) * 137) % 360}, 70%, 80%)`;
const byTeacher = () => { const box = document.getElementById("byTeacher"); return box !== null && box.checked; };
function render() {
  const box = document.getElementById("rows");
  data.rows.forEach((row, r) => {
    const div = document.createElement("div"); div.className = "row";
    row.tokens.forEach(t => {
      const span = document.createElement("span");
      span.className = "tok";
      if (t.t === "") { span.classList.add("special"); span.textContent = t.piece; }
      else { span.textContent = t.t; span.style.background = byTeacher() ? teacherColour(t.by) : colour(t.teacher); }
      if (t.kept === true) span.classList.add("kept");
      if (t.kept === false) span.classList.add("dropped");
      if (t.k > 0) span.classList.add("canary", "k" + t.k);
      span.onmouseenter = () => {
        const kind = t.k >= 0 ? data.kinds[t.k] : "special";
        const teacher = t.teacher === null || t.teacher === undefined ? "none" : t.teacher.toFixed(3);
        const state = t.kept === null ? "predicts nothing (a row's first token)" : t.kept ? "kept" : "dropped";
        document.getElementById("info").textContent = `row ${r}  ${JSON.stringify(t.piece)}  ${kind}  ` +
          `teacher loss ${teacher}${t.by ? " (" + t.by + ")" : ""}  ` +
          `student loss ${t.student === undefined ? "-" : t.student.toFixed(3)}  ${state}`;
      };
      div.appendChild(span);
    });
    box.appendChild(div);
  });
}
function chart() {  // each variant's kept share of each kind's mapped tokens, as bars: clean high, canaries low
  const head = data.kinds.map((kind, i) => `<th><span class="bar k${i}bar" style="width:1em"></span>${kind}</th>`);
  const rows = Object.entries(data.variants).map(([name, v]) => `<tr><td>${name}</td>` + data.kinds.map((kind, i) =>
    `<td><span class="bar k${i}bar" style="width:${(100 * v.kept_share[kind]).toFixed(1) / 10}em"></span>` +
    `${v.kept_share[kind].toFixed(3)}</td>`).join("") + "</tr>").join("");
  document.getElementById("chart").innerHTML =
    `<table class="chart"><tr><th>variant</th>${head.join("")}</tr>${rows}</table>`;
}
function verdict() {  // the verdict box: its words as text, never as markup
  const box = document.getElementById("verdict"), v = data.verdict;
  box.className = v.level.replaceAll(" ", "-");
  const head = document.createElement("h2"); head.textContent = "verdict: " + v.level;
  const line = document.createElement("p"); line.textContent = v.line;
  box.append(head, line);
  if (v.advice.length) {
    const list = document.createElement("ul");
    v.advice.forEach(a => { const item = document.createElement("li"); item.textContent = "try: " + a;
                            list.appendChild(item); });
    box.appendChild(list);
  }
}
verdict(); summary(); chart(); render();
</script></body></html>
"""
