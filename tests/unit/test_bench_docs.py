"""The docs' benchmark tables are exactly what `specdec bench --report` renders from the
committed results (a stale table fails here), and the one speedup definition holds."""

from __future__ import annotations

import pytest

from specdec_tools.bench import docs, harness, report
from specdec_tools.bench.harness import Sample

LATEST = docs.ROOT / "docs" / "bench-latest.json"


@pytest.fixture(scope="module")
def generated():
    return docs.regions(*report.load_json(LATEST))


@pytest.mark.parametrize("path", docs.FILES, ids=lambda p: p.name)
def test_docs_regions_are_rendered_from_the_committed_json(path, generated):
    text = path.read_text()
    assert docs.REGION.search(text), f"{path.name} has no bench region"
    assert docs.render(text, generated) == text, (
        f"{path.name} is stale: run `specdec bench --report docs/bench-latest.json`")


def test_both_files_show_the_same_headline(generated):
    for path in docs.FILES:
        assert "<!-- bench:headline -->\n" + generated["headline"] in path.read_text()


def test_an_unknown_region_is_an_error(generated):
    with pytest.raises(KeyError):
        docs.render("<!-- bench:nope -->\nx\n<!-- /bench:nope -->", generated)


def test_render_replaces_only_the_region(generated):
    text = "before\n<!-- bench:loops -->\nold\n<!-- /bench:loops -->\nafter\n"
    out = docs.render(text, generated)
    assert out.startswith("before\n") and out.endswith("after\n") and "old" not in out
    assert docs.render(out, generated) == out


def s(name, prompt, repeat, tps):
    return Sample(name, prompt, int(tps * 10), 10.0, repeat=repeat)


def test_speedup_is_the_median_of_same_prompt_same_repeat_ratios():
    base, spec = "base", "spec"
    samples = [s(base, "a", 0, 10), s(spec, "a", 0, 20),  # 2.0
               s(base, "a", 1, 20), s(spec, "a", 1, 20),  # 1.0
               s(base, "b", 0, 10), s(spec, "b", 0, 40)]  # 4.0
    assert sorted(harness.ratios(samples, spec, base)) == [1.0, 2.0, 4.0]
    assert harness.speedup(samples, spec, base) == 2.0
    # not the ratio of medians (20/10 = 2.0 here too, so make them differ):
    samples.append(s(spec, "c", 0, 100))  # no target-only twin: left out
    assert harness.speedup(samples, spec, base) == 2.0
    assert "median" in harness.SPEEDUP_DEFINITION and "same prompt" in harness.SPEEDUP_DEFINITION
