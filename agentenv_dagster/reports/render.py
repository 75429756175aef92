"""Writes a run's reports: run.json, run.md and task.html at the root, task.json and its page
row.html per replicate, suite.json and suite.md per dataset suite.

run.md is shaped for a GitHub job summary; task.html and the row pages are self-contained
(inline CSS, no external assets) so they open straight from a CI artifact. task.html carries
one inline script of ours, the rows' filter, which its Content-Security-Policy names by hash:
were an agent's text ever to reach the page as markup, no script of its would run.
"""

from __future__ import annotations

import base64
import hashlib
import html
import importlib.resources
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote

import jinja2
from markupsafe import Markup

from ..criteria.judge_prompt import write_judge_transcripts
from .experiment import variant_comparison
from ..redaction import redact_text
from .models import EvaluationResult, RunSummary
from .timeline import timeline

TEMPLATES = ("run.md", "run_rows.md", "task.html", "task_rows.html", "row.html", "_style.css", "suite.md")
ROW_PAGE = "row.html"
_POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


@dataclass(frozen=True)
class WrittenReports:
    """Where `write_reports` put each file, so callers can attach or link them."""

    run_json: Path
    run_md: Path
    task_html: Path
    task_jsons: list[Path]


def task_json_path(out_dir: Path | str, result: EvaluationResult) -> Path:
    """`<out_dir>/<variant>/<task_id>/<NN>/task.json`; a dataset task id's `/` nests folders."""
    return report_folder(out_dir, result.variant_id, result.task_id, result.replicate_index) / "task.json"


def report_folder(out_dir: Path | str, variant_id: str, task_id: str, replicate_index: int) -> Path:
    """`<out_dir>/<variant>/<task_id>/<NN>`. Ids come from task documents, so a segment that
    would climb out of `out_dir` is refused."""
    return Path(out_dir).joinpath(*_segments(variant_id, task_id, replicate_index))


def row_page_path(out_dir: Path | str, task_id: str, variant_id: str = "default", replicate_index: int = 0) -> Path:
    """Where a row's page is: `<out_dir>/<variant>/<task_id>/<NN>/row.html` (beside its task.json)."""
    return report_folder(out_dir, variant_id, task_id, replicate_index) / ROW_PAGE


def row_page_url(
    out_dir: Path | str, task_id: str, variant_id: str = "default", replicate_index: int = 0, *,
    base_url: str | None = None,
) -> str:
    """A row's page as a link: a ``file://`` URL of the page in ``out_dir``, or, given the
    ``base_url`` that `agentenv-dagster view OUT_DIR` printed, its address there."""
    if base_url is None:
        return row_page_path(Path(out_dir).resolve(), task_id, variant_id, replicate_index).as_uri()
    return base_url.rstrip("/") + "/" + _row_href(variant_id, task_id, replicate_index)


def _segments(variant_id: str, task_id: str, replicate_index: int) -> list[str]:
    segments = [variant_id, *task_id.split("/")]
    for segment in segments:
        if segment in ("", ".", "..") or "\\" in segment:
            raise ValueError(
                f"task {task_id!r} (variant {variant_id!r}): path segment {segment!r} cannot name a report folder"
            )
    return [*segments, f"{replicate_index:02d}"]


def _row_href(variant_id: str, task_id: str, replicate_index: int, page: str = ROW_PAGE) -> str:
    """A row's page (or another file of its folder) relative to the run's folder, URL-quoted."""
    return "/".join(quote(s, safe="") for s in _segments(variant_id, task_id, replicate_index)) + "/" + page


def prepare_reports(out_dir: Path | str, variant_id: str, task_ids: list[str], replicate_index: int) -> None:
    """What the reports need, done ahead: the folders these tasks' task.json go in (the
    runs write them as they end), and the templates compiled. While a dataset's runs go on,
    this process is idle; done then, the folders (two ``mkdir`` a row) and the compiling do not
    follow the runs."""
    for task_id in task_ids:
        report_folder(out_dir, variant_id, task_id, replicate_index).mkdir(parents=True, exist_ok=True)
    compile_templates(*TEMPLATES)


def compile_templates(*templates: str) -> None:
    """These templates compiled now, ahead of their first use in this process."""
    for template in templates:
        _environment().get_template(template)


class RenderedRows:
    """Each result's parts of run.md and task.html (its summary rows, its sections), rendered
    once: :meth:`add` them as the results come (a dataset's command adds each run's rows
    as that run ends, while the later runs go on), and the reports then join them, so little
    rendering is left after the last run. A result is rendered as it is when added."""

    def __init__(self) -> None:
        self._parts: dict[int, tuple[EvaluationResult, dict[str, str]]] = {}  # by id(result), with it

    def add(self, results: Iterable[EvaluationResult]) -> None:
        for result in results:
            self._of(result)

    def joined(self, results: list[EvaluationResult], part: str) -> str:
        """That part (``html_row``, ``html_section``, ``md_row``, ``md_section``) of each result, joined."""
        parts = [self._of(result)[part] for result in results]
        return Markup("").join(parts) if part.startswith("html") else "".join(parts)

    def _of(self, result: EvaluationResult) -> dict[str, str]:
        kept = self._parts.get(id(result))
        if kept is None or kept[0] is not result:
            html_rows = _environment().get_template("task_rows.html").module
            md_rows = _environment().get_template("run_rows.md").module
            anchor, folder = _anchor(result), _result_href(result, "")
            kept = self._parts[id(result)] = (result, {
                "html_row": html_rows.summary_row(result, anchor),
                "html_section": html_rows.section(result, anchor, folder),
                "md_row": md_rows.summary_row(result), "md_section": md_rows.section(result),
            })
        return kept[1]


def _result_href(result: EvaluationResult, page: str = ROW_PAGE) -> str:
    return _row_href(result.variant_id, result.task_id, result.replicate_index, page)


def _anchor(result: EvaluationResult) -> str:
    """A result's section in task.html: its variant, task id and replicate (one of each a run)."""
    return re.sub(r"\s", "_", f"task-{result.variant_id}/{result.task_id}/{result.replicate_index:02d}")


def write_reports(
    out_dir: Path | str, summary: RunSummary, results: list[EvaluationResult], *, task_jsons_written: bool = False,
    rendered: RenderedRows | None = None,
) -> WrittenReports:
    """Write every report of one run; existing files are overwritten so a re-run refreshes them.
    ``task_jsons_written``: the results' task.json files are there already (`write_task_json`,
    by the runs that made them). ``rendered``: the results' parts rendered ahead (else now)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = WrittenReports(
        run_json=out_dir / "run.json",
        run_md=out_dir / "run.md",
        task_html=out_dir / "task.html",
        task_jsons=[task_json_path(out_dir, r) if task_jsons_written else write_task_json(out_dir, r) for r in results],
    )
    _write(written.run_json, summary.model_dump_json(indent=2))
    rendered = rendered or RenderedRows()
    _write(written.run_md, _render("run.md", summary, results, rendered))
    _write(written.task_html, _render("task.html", summary, results, rendered))
    return written


def _write(path: Path, text: str) -> None:
    """A report, with every known secret value in it replaced by ``***`` (``redaction.py``)."""
    path.write_text(redact_text(text), encoding="utf-8")


def write_task_json(out_dir: Path | str, result: EvaluationResult) -> Path:
    """A result's task.json, with its judges' transcripts (their paths in it) and its page,
    row.html, beside it."""
    path = task_json_path(out_dir, result)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_judge_transcripts(result, path.parent)
    _write(path, result.model_dump_json(indent=2))
    _write(path.parent / ROW_PAGE, _row_page(result))
    return path


def _row_page(result: EvaluationResult) -> str:
    """The row's page; it links back to the run's task.html, at the run's folder."""
    climb = "../" * len(_segments(result.variant_id, result.task_id, result.replicate_index))
    return _environment().get_template(ROW_PAGE).render(
        r=result, anchor=_anchor(result), run_page=f"{climb}task.html#{quote(_anchor(result), safe='/')}",
        policy=_POLICY)


def write_suite(folder: Path, suite: dict[str, Any]) -> None:
    """A suite's suite.json and suite.md, in ``<variant>/<suite_id>/`` as upstream writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / "suite.json", json.dumps(suite, indent=2, default=str))
    _write(folder / "suite.md", suite_markdown(suite))


def suite_markdown(suite: dict[str, Any]) -> str:
    """The suite as Markdown: counts, each criterion's thresholds, metrics and confusion matrix."""
    return _environment().get_template("suite.md").render(suite=suite)


def _write_judge_transcripts(result: EvaluationResult, folder: Path) -> None:
    """Judge transcripts go beside task.json as judge-<N>.yaml; the rows keep their paths."""
    rows = [*result.success_criteria_results, *result.post_failure_criteria_results]
    written = write_judge_transcripts([{"transcript": (r.model_extra or {}).get("transcript")} for r in rows], folder)
    for row, saved in zip(rows, written):
        row.transcript_path = saved.get("transcript_path") or row.transcript_path


def _render(template: str, summary: RunSummary, results: list[EvaluationResult], rows: RenderedRows) -> str:
    script, _ = filter_script()
    return _environment().get_template(template).render(
        summary=summary, results=results, rows=rows, comparison=variant_comparison(results),
        script=Markup(script), policy=page_policy())


@cache
def filter_script() -> tuple[str, str]:
    """task.html's one script, and its hash as a Content-Security-Policy source."""
    text = (importlib.resources.files(__package__) / "templates" / "filter.js").read_text(encoding="utf-8")
    return text, "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def page_policy() -> str:
    """The Content-Security-Policy of the reports' pages: inline style, and no script but
    task.html's filter; nothing loads from anywhere."""
    return f"{_POLICY}; script-src {filter_script()[1]}"


def _is_local_file(value: Any) -> bool:
    """A file name in the row's own folder (a judge transcript), safe as a relative link."""
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", value) is not None


def _score(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _usd(value: float | None) -> str:
    """Unpriced is not free, so `None` never prints as $0."""
    return "n/a" if value is None else f"${value:.4f}"


def _md_cell(value: Any, limit: int = 300) -> str:
    """Keep a value inside one GitHub table cell: no raw HTML, no pipes, no line breaks."""
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def _pretty_json(value: Any) -> str:
    """Plain text for a <pre>; autoescaping then makes it safe."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("agentenv_dagster.reports", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html",), default_for_string=False),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        score=_score, percent=_percent, usd=_usd, md_cell=_md_cell, pretty_json=_pretty_json
    )
    env.globals.update(timeline=timeline, row_href=_result_href)
    env.tests["local_file"] = _is_local_file
    return env
