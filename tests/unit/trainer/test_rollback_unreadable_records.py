"""Which unreadable records stop a rollback without ``--to`` (it cannot tell whether it would go back to one of
them) and which do not, what its errors name, and the plan it makes: on a store that holds records as given."""

from __future__ import annotations

from typing import Any

import pytest

from app.model.errors import CurrentChangedError, ModelNotFoundError, RegistryError
from app.registry.base import CorruptRecordError, ModelRecord
from app.trainer.rollback import listing, plan_rollback, roll_back

KEY = "rb:cpu"


def rec(version: int, sha: str, restores: int | None = None) -> ModelRecord:
    return ModelRecord(KEY, version, sha * 64, "ubj", (), {}, {}, 1, None, 0.0, "", restores)


def bad(version: int | None) -> CorruptRecordError:
    return CorruptRecordError(KEY, version, "metadata is not JSON")


class Records:
    """A model store reduced to what planning a rollback reads: the current record and the kept ones."""

    def __init__(self, current: ModelRecord | None, kept: list[ModelRecord],
                 unreadable: list[CorruptRecordError] = ()) -> None:  # type: ignore[assignment]
        self._current, self._kept, self._unreadable = current, kept, list(unreadable)

    def current(self, model_key: str) -> ModelRecord | None:
        return self._current

    def keys(self) -> list[str]:
        return [KEY] if self._kept else []

    def readable_versions(self, model_key: str) -> tuple[list[ModelRecord], list[CorruptRecordError]]:
        return list(self._kept), list(self._unreadable)


def target(store: Records) -> int:
    return plan_rollback(store, KEY).target.version  # type: ignore[arg-type]


def test_an_unreadable_version_above_the_current_one_does_not_stop_a_rollback_where_nothing_was_trimmed() -> None:
    # v4 was saved after v3 was promoted and was never promoted (a challenger that lost)
    v1, v2, v3 = rec(1, "a"), rec(2, "b"), rec(3, "c")
    assert target(Records(v3, [v1, v2, v3], [bad(4)])) == 2


def test_an_unreadable_version_between_the_target_and_the_current_one_is_the_one_named() -> None:
    v1, v3 = rec(1, "a"), rec(3, "c")
    with pytest.raises(RegistryError, match=r"^model 'rb:cpu' version 2: metadata is not JSON: cannot tell whether"):
        target(Records(v3, [v1, v3], [bad(2), bad(4)]))


def test_with_a_version_trimmed_in_between_an_unreadable_one_above_stops_the_rollback() -> None:
    # v2 trimmed, v3 and v4 retrained to the current model's blob: a rollback copy above (v6) might hold v2's model
    v1, v3, v4, v5 = rec(1, "a"), rec(3, "e"), rec(4, "e"), rec(5, "e")
    with pytest.raises(RegistryError, match=r"^model 'rb:cpu' version 6: .*name the version to go back to \(--to\)$"):
        target(Records(v5, [v1, v3, v4, v5], [bad(6)]))
    assert target(Records(v5, [v1, v3, v4, v5])) == 1  # readable, nothing above: back to v1


def test_an_unreadable_version_whose_model_a_kept_copy_holds_does_not_stop_the_rollback() -> None:
    # v1 unreadable, v3 a rollback copy of it: going back to v1's model is going back to v3
    v2, v3, v4 = rec(2, "b"), rec(3, "a", restores=1), rec(4, "b", restores=2)
    assert target(Records(v4, [v2, v3, v4], [bad(1)])) == 3


def test_the_unreadable_version_whose_model_the_current_copy_serves_does_not_stop_the_rollback() -> None:
    v1, v3, v4 = rec(1, "a"), rec(3, "c"), rec(4, "b", restores=2)
    assert target(Records(v4, [v1, v3, v4], [bad(2)])) == 1


def test_an_unreadable_record_that_names_no_version_does_not_stop_the_rollback() -> None:
    v1, v2, v3 = rec(1, "a"), rec(2, "b"), rec(3, "c")
    assert target(Records(v3, [v1, v2, v3], [bad(None)])) == 2


def test_a_plan_made_without_an_announced_version_says_none_was() -> None:
    plan = plan_rollback(Records(rec(2, "b"), [rec(1, "a"), rec(2, "b")]), KEY)  # type: ignore[arg-type]
    assert (plan.model_key, plan.current.version, plan.target.version, plan.announced) == (KEY, 2, 1, 0)


def test_the_errors_name_the_key_and_the_version() -> None:
    with pytest.raises(ModelNotFoundError) as unknown:
        plan_rollback(Records(None, []), KEY)  # type: ignore[arg-type]
    assert (unknown.value.model_key, unknown.value.version) == (KEY, None)
    one = Records(rec(1, "a"), [rec(1, "a")])
    with pytest.raises(ModelNotFoundError, match=r"^model 'rb:cpu' has no version older than 1$") as first:
        plan_rollback(one, KEY)  # type: ignore[arg-type]
    assert first.value.model_key == KEY
    two = Records(rec(2, "b"), [rec(1, "a"), rec(2, "b")])
    with pytest.raises(ModelNotFoundError) as missing:
        plan_rollback(two, KEY, to_version=5)  # type: ignore[arg-type]
    assert (missing.value.model_key, missing.value.version) == (KEY, 5)
    same = Records(rec(3, "a"), [rec(1, "a"), rec(2, "b"), rec(3, "a")])
    with pytest.raises(RegistryError, match=r"^model 'rb:cpu': v1 is the model the current v3 serves already "
                                            r"\(sha256 aaaaaaaaaaaa\)$"):
        plan_rollback(same, KEY, to_version=1)  # type: ignore[arg-type]


def test_listing_says_more_only_when_there_are_more() -> None:
    assert listing(["a:cpu", "b:cpu"], shown=2) == "a:cpu, b:cpu"
    assert listing([]) == "none"


class _Promoted:
    """A registry whose current version is gone by the time the rollback would replace it."""

    def restore(self, *args: Any, **kw: Any) -> dict[str, Any]:
        raise CurrentChangedError(KEY, 2, None)


def test_a_rollback_whose_current_version_vanished_says_so() -> None:
    plan = plan_rollback(Records(rec(2, "b"), [rec(1, "a"), rec(2, "b")]), KEY)  # type: ignore[arg-type]
    with pytest.raises(RegistryError, match="^the current version of rb:cpu changed to none while rolling back"):
        roll_back(_Promoted(), plan)  # type: ignore[arg-type]


def test_with_a_version_trimmed_the_unreadable_version_whose_model_the_current_copy_serves_does_not_stop_it() -> None:
    # v2 trimmed, v3 unreadable: the current v5 is a rollback copy of v3's model, so v3 is not gone back to
    v1, v4, v5 = rec(1, "a"), rec(4, "c"), rec(5, "b", restores=3)
    assert target(Records(v5, [v1, v4, v5], [bad(3)])) == 1
