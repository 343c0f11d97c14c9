"""The docs hold together: every relative link resolves, every output block names its command, the figure
markers parse, and ``scripts/update_docs.py`` finds stale figures and rewrites them (on small stand-in
commands here; the real figures are rerun by ``tests/distributed/test_docs_figures.py``)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("update_docs", REPO / "scripts" / "update_docs.py")
update_docs = importlib.util.module_from_spec(_spec)
sys.modules["update_docs"] = update_docs
_spec.loader.exec_module(update_docs)

DOCS = [*update_docs.doc_files(REPO), REPO / "CONTRIBUTING.md", REPO / "examples" / "README.md",
        REPO / "patches" / "README.md"]
# Written by the option-table generator on another branch; checked like any page once it exists.
GENERATED_ELSEWHERE = {REPO / "docs" / "options.md"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", path.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text(encoding="utf-8")))


def test_slugs_follow_github() -> None:
    page = "# What is patched\n## From the shell: `megatron-dpsched plan`, a what-if tool\n## PP=2: x\n## PP=2: x\n"
    path = Path(__file__).with_name("_slug_probe.md")
    path.write_text(page, encoding="utf-8")
    try:
        assert _anchors(path) == {"what-is-patched", "from-the-shell-megatron-dpsched-plan-a-what-if-tool",
                                  "pp2-x", "pp2-x-1"}
    finally:
        path.unlink()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for link in _links(doc):
        if re.match(r"^[a-z]+:", link):  # https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if path in GENERATED_ELSEWHERE and not path.exists():
            continue
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading with anchor #{anchor}")
    assert not broken, f"{doc.relative_to(REPO)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", update_docs.doc_files(REPO), ids=lambda p: str(p.relative_to(REPO)))
def test_every_output_block_is_a_figure_with_its_command(doc: Path) -> None:
    assert update_docs.unmarked_blocks(doc) == [], f"{doc}: ```text blocks without a figure marker"
    for figure in update_docs.parse_figures(doc):
        assert figure.command.strip() and figure.output.strip(), figure.where
        for pattern, found in [] if figure.check_all else update_docs.checked_values(figure, figure.output):
            assert found, f"{figure.where}: check {pattern!r} finds no line of the figure"


def test_readme_is_a_front_door() -> None:
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


def _page(tmp_path: Path, body: str, output: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\n<!-- figure\n{body}\n-->\n```text\n$ printf 'mb 3 of 4\\nt 0.5 s\\n'\n{output}\n```\n"
                    "after\n", encoding="utf-8")
    return page


def test_check_passes_when_the_checked_lines_match_and_timings_moved(tmp_path: Path) -> None:
    page = _page(tmp_path, "check: ^mb (\\d+)", "mb 3 of 9\nt 9.9 s")
    assert update_docs.main(["--check", str(page)]) == 0


def test_check_fails_on_a_stale_figure_and_names_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    page = _page(tmp_path, "check: ^mb", "mb 2 of 4\nt 0.5 s")
    assert update_docs.main(["--check", str(page)]) == 1
    err = capsys.readouterr().err
    assert "page.md:3: stale figure" in err and "mb 2 of 4" in err and "mb 3 of 4" in err
    assert "mb 2 of 4" in page.read_text(encoding="utf-8"), "--check must not rewrite"


def test_check_all_compares_every_line(tmp_path: Path) -> None:
    assert update_docs.main(["--check", str(_page(tmp_path, "check: all", "mb 3 of 4\nt 0.5 s"))]) == 0
    assert update_docs.main(["--check", str(_page(tmp_path, "check: all", "mb 3 of 4\nt 0.6 s"))]) == 1


def test_rewrite_replaces_only_the_output(tmp_path: Path) -> None:
    page = _page(tmp_path, "check: ^mb\nslow", "old")
    before = page.read_text(encoding="utf-8")
    assert update_docs.main([str(page)]) == 0
    after = page.read_text(encoding="utf-8")
    assert after == before.replace("\nold\n", "\nmb 3 of 4\nt 0.5 s\n")
    assert update_docs.main(["--check", str(page)]) == 0


def test_a_figure_whose_needs_are_unset_is_left_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    page = _page(tmp_path, "check: ^mb\nneeds: DPSCHED_TEST_PEER_A DPSCHED_TEST_PEER_B", "old")
    before = page.read_text(encoding="utf-8")
    monkeypatch.setenv("DPSCHED_TEST_PEER_A", "/somewhere")
    monkeypatch.delenv("DPSCHED_TEST_PEER_B", raising=False)
    assert update_docs.main([str(page)]) == 0 and update_docs.main(["--check", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == before
    assert "set DPSCHED_TEST_PEER_B to rerun it" in capsys.readouterr().err
    monkeypatch.setenv("DPSCHED_TEST_PEER_B", "/elsewhere")
    assert update_docs.main([str(page)]) == 0
    assert "mb 3 of 4" in page.read_text(encoding="utf-8")


def test_a_failing_command_is_an_error_not_a_figure(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- figure\ncheck: all\n-->\n```text\n$ echo x | false\nx\n```\n", encoding="utf-8")
    assert update_docs.main([str(page)]) == 1
    assert "\nx\n" in page.read_text(encoding="utf-8")


@pytest.mark.parametrize("body,message", [("frobnicate", "unknown figure marker line"),
                                          ("check: (", "bad check regex")])
def test_bad_markers_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, body: str, message: str) -> None:
    assert update_docs.main(["--list", str(_page(tmp_path, body, "x"))]) == 2
    assert message in capsys.readouterr().err


def test_unmarked_output_block_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("a\n\n```text\npasted output\n```\n", encoding="utf-8")
    assert update_docs.unmarked_blocks(page) == [3]
