"""Rendezvous hashing: stable across processes, and minimal movement when nodes come and go."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from router import rendezvous_rank
from router.affinity import rendezvous_weight

ids = st.lists(st.text(min_size=1, max_size=8), min_size=2, max_size=12, unique=True)


def test_weights_do_not_depend_on_the_process() -> None:
    # A fixed vector: Python's salted hash() would change this on every run.
    assert rendezvous_weight("prompt", "node-a") == 0xE2E66EF75F670354
    assert rendezvous_rank("prompt", ["node-a", "node-b", "node-c"]) == ("node-a", "node-c", "node-b")


@given(key=st.text(max_size=30), node_ids=ids)
def test_rank_is_a_permutation_independent_of_input_order(key: str, node_ids: list[str]) -> None:
    ranked = rendezvous_rank(key, node_ids)

    assert sorted(ranked) == sorted(node_ids)
    assert rendezvous_rank(key, reversed(node_ids)) == ranked


@given(key=st.text(max_size=30), node_ids=ids, data=st.data())
def test_removing_another_node_does_not_move_the_first(
    key: str, node_ids: list[str], data: st.DataObject
) -> None:
    first = rendezvous_rank(key, node_ids)[0]
    removed = data.draw(st.sampled_from([i for i in node_ids if i != first]))

    assert rendezvous_rank(key, [i for i in node_ids if i != removed])[0] == first


@given(key=st.text(max_size=30), node_ids=ids, new=st.text(min_size=1, max_size=8))
def test_adding_a_node_keeps_the_relative_order_of_the_others(
    key: str, node_ids: list[str], new: str
) -> None:
    assume(new not in node_ids)
    before = rendezvous_rank(key, node_ids)
    after = rendezvous_rank(key, [*node_ids, new])

    assert tuple(i for i in after if i != new) == before
