"""Judge-vs-human agreement figures (recall_tasks/analysis/agreement.py): known answers, degenerate sets, intervals."""

from __future__ import annotations

import pytest

from recall_tasks.analysis.agreement import (
    FIGURES,
    Confusion,
    Figure,
    PairedRow,
    agreement,
    by_category,
    cohen_kappa,
    compare,
    figures_differ,
    spearman,
)


def table_rows(tp: int, fn: int, fp: int, tn: int) -> list[PairedRow]:
    """One single-unit row per cell count of a 2x2 table (human, judge)."""
    cells = [(True, True)] * tp + [(True, False)] * fn + [(False, True)] * fp + [(False, False)] * tn
    return [PairedRow([h], [j], key=str(i)) for i, (h, j) in enumerate(cells)]


def test_kappa_of_the_textbook_table() -> None:
    # Cohen's kappa, the classic 50-item example: 20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no.
    # p_o = 35/50 = 0.7; p_e = 0.5*0.6 + 0.5*0.4 = 0.5; kappa = (0.7-0.5)/(1-0.5) = 0.4
    kappa, reason = cohen_kappa(Confusion(tp=20, fn=5, fp=10, tn=15))
    assert reason is None
    assert kappa == pytest.approx(0.4)
    a = agreement(table_rows(20, 5, 10, 15))
    assert a.confusion == Confusion(20, 5, 10, 15)
    assert a.accuracy.value == pytest.approx(0.7)
    assert a.kappa.value == pytest.approx(0.4)
    assert a.tpr.value == pytest.approx(20 / 25)
    assert a.tnr.value == pytest.approx(15 / 25)
    for name in FIGURES[:4]:
        fig = a.figures()[name]
        assert fig.low is not None and fig.high is not None
        assert fig.low < fig.value < fig.high, name  # type: ignore[operator]


def test_kappa_of_a_second_table() -> None:
    # 100 units: 45 yes/yes, 15 yes/no, 25 no/yes, 15 no/no. p_o = 0.6; human yes 0.6, judge yes 0.7;
    # p_e = 0.6*0.7 + 0.4*0.3 = 0.54; kappa = 0.06/0.46 = 0.1304...
    kappa, _ = cohen_kappa(Confusion(tp=45, fn=15, fp=25, tn=15))
    assert kappa == pytest.approx(0.06 / 0.46)


def test_perfect_and_chance_agreement() -> None:
    assert agreement(table_rows(10, 0, 0, 10)).kappa.value == pytest.approx(1.0)
    # the judge says "supported" for everything on a balanced set: half right, no better than chance
    a = agreement(table_rows(10, 0, 10, 0))
    assert a.accuracy.value == pytest.approx(0.5)
    assert a.kappa.value == pytest.approx(0.0)
    assert a.tpr.value == 1.0 and a.tnr.value == 0.0


def test_one_class_gives_no_kappa_and_says_why() -> None:
    a = agreement(table_rows(8, 2, 0, 0))  # every human label is "supported"
    assert a.kappa.value is None and a.kappa.low is None
    assert a.kappa.reason is not None and "every human label is supported" in a.kappa.reason
    assert a.tnr.value is None and a.tnr.reason == "no unit labelled unsupported"
    assert a.tpr.value == pytest.approx(0.8)
    b = agreement(table_rows(0, 0, 3, 7))
    assert b.kappa.value is None and "unsupported" in (b.kappa.reason or "")
    assert b.tpr.value is None and b.tpr.reason == "no unit labelled supported"
    empty = agreement([])
    assert empty.units == 0 and all(f.value is None for f in empty.figures().values())
    assert empty.accuracy.reason == "no units"


def test_row_scores_mae_and_spearman() -> None:
    rows = [
        PairedRow([True, True], [True, False], key="a"),  # human 1.0, judge 0.5
        PairedRow([True, False], [True, False], key="b"),  # 0.5, 0.5
        PairedRow([], [], human_score=0.0, judge_score=0.25, key="c"),  # a row labelled by its score only
        PairedRow([False, False], [False, False], key="d"),  # 0.0, 0.0
    ]
    a = agreement(rows)
    assert a.rows == 4 and a.units == 6 and a.score_rows == 4
    assert a.mae.value == pytest.approx((0.5 + 0 + 0.25 + 0) / 4)
    # human ranks (1.0, 0.5, 0, 0) -> 4, 3, 1.5, 1.5; judge (0.5, 0.5, 0.25, 0) -> 3.5, 3.5, 2, 1
    assert a.spearman.value == pytest.approx(spearman([4, 3, 1.5, 1.5], [3.5, 3.5, 2, 1])[0])
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4])[0] == pytest.approx(0.8)  # 1 - 6*2/(4*15)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 3])[0] == pytest.approx(3.75 / 4.5)  # ties: Pearson of average ranks
    assert spearman([1, 2], [1, 2]) == (None, "needs at least 3 rows with both scores, has 2")
    assert spearman([1, 1, 1], [1, 2, 3])[1] == "undefined: the human or the judge scores are all equal"


def test_bootstrap_is_seeded_and_resamples_rows_not_units() -> None:
    # 20 rows of 5 units each; a row is all right or all wrong (units of a row are correlated)
    rows = [PairedRow([True] * 5, [i % 4 != 0] * 5, key=str(i)) for i in range(20)]
    a, again = agreement(rows), agreement(rows)
    assert a.accuracy == again.accuracy  # deterministic
    textbook = table_rows(20, 5, 10, 15)
    assert agreement(textbook, seed=1).kappa != agreement(textbook).kappa  # the seed is what fixes it
    # the same 100 verdicts as 100 independent rows: resampling units would give this narrower interval
    flat = [
        PairedRow([h], [j], key=f"{r.key}.{k}")
        for r in rows
        for k, (h, j) in enumerate(zip(r.human, r.judge, strict=True))
    ]
    fa = agreement(flat)
    assert a.accuracy.value == fa.accuracy.value == pytest.approx(0.75)
    width_rows = a.accuracy.high - a.accuracy.low  # type: ignore[operator]
    width_units = fa.accuracy.high - fa.accuracy.low  # type: ignore[operator]
    assert width_rows > 1.8 * width_units  # ~sqrt(5) wider


def test_interval_covers_the_truth_at_about_the_nominal_rate() -> None:
    import numpy as np

    rng = np.random.default_rng(7)
    covered = 0
    for trial in range(200):
        rows = [PairedRow([True], [bool(rng.random() < 0.8)], key=str(i)) for i in range(60)]
        fig = agreement(rows, resamples=400, seed=trial).accuracy
        covered += fig.contains(0.8)
    assert 0.88 <= covered / 200 <= 0.99  # percentile bootstrap at n=60 runs a little below 95 %


def test_by_category() -> None:
    rows = [PairedRow([True], [True], category="date"), PairedRow([False], [True], category="negation")]
    rows.append(PairedRow([True], [True]))
    cats = by_category(rows)
    assert list(cats) == ["(none)", "date", "negation"]
    assert cats["negation"].accuracy.value == 0.0 and cats["date"].accuracy.value == 1.0


def test_compare_paired_finds_a_drift_and_no_drift_when_unchanged() -> None:
    human = [[True, False, True, True, False] for _ in range(30)]
    a = [PairedRow(h, h, key=str(i)) for i, h in enumerate(human)]
    # b: the judge flips exactly one unit in every row (accuracy 0.8), rows listed in another order
    b = [PairedRow(h, [not v if k == i % 5 else v for k, v in enumerate(h)], key=str(i)) for i, h in enumerate(human)]
    d = compare(a, list(reversed(b)), "accuracy")
    assert d.paired and d.differs
    assert d.delta == pytest.approx(-0.2) and d.high is not None and d.high < 0
    same = compare(a, list(reversed(a)), "kappa")
    assert same.paired and not same.differs and same.delta == pytest.approx(0.0)
    unpaired = compare(a, [PairedRow(r.human, r.judge) for r in b], "accuracy")
    assert not unpaired.paired and unpaired.differs
    with pytest.raises(ValueError, match="unknown figure"):
        compare(a, b, "f1")
    undefined = compare(table_rows(3, 0, 0, 0), table_rows(3, 0, 0, 0), "kappa")
    assert not undefined.differs and undefined.reason == "kappa undefined in a"


def test_compare_does_not_flag_noise() -> None:
    # two independent judges of the same quality on different rows: no difference claimed
    import numpy as np

    rng = np.random.default_rng(3)

    def sample(n: int) -> list[PairedRow]:
        return [PairedRow([bool(h)], [bool(h) if rng.random() < 0.85 else not h]) for h in rng.random(n) < 0.6]

    flagged = sum(compare(sample(80), sample(80), "accuracy", resamples=500, seed=s).differs for s in range(40))
    assert flagged <= 5  # ~5 % expected


def test_figures_differ_by_interval_overlap() -> None:
    a = Figure("accuracy", 0.9, 0.85, 0.95)
    assert figures_differ(a, Figure("accuracy", 0.7, 0.6, 0.8))
    assert not figures_differ(a, Figure("accuracy", 0.8, 0.7, 0.86))
    assert not figures_differ(a, Figure("kappa", None, reason="undefined"))


def test_row_with_mismatched_units_is_refused() -> None:
    with pytest.raises(ValueError, match="2 human verdicts but 1 judge's"):
        PairedRow([True, False], [True])
