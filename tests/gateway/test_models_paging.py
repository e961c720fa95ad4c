"""Anthropic's paging of the model list (`limit`, `after_id`, `before_id`) over the catalog:
walked either way with any page size, every model comes once, in order, and `has_more` says
whether a page follows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.api.models_routes import anthropic_page
from protocol import InvalidRequestError
from router.types import CatalogModel

CATALOGS = st.lists(st.text("abcdef-/", min_size=1, max_size=6), max_size=12, unique=True).map(
    lambda names: [CatalogModel(name=name, tier="small") for name in names]
)


@given(catalog=CATALOGS, limit=st.integers(1, 14))
def test_walking_forward_by_after_id_gives_every_model_once_in_order(
    catalog: list[CatalogModel], limit: int
) -> None:
    seen, query = [], {"limit": str(limit)}
    while True:
        page = anthropic_page(catalog, query)
        seen += [model.id for model in page.data]
        assert (page.first_id, page.last_id) == (
            (page.data[0].id, page.data[-1].id) if page.data else (None, None)
        )
        if not page.has_more:
            break
        query = {"limit": str(limit), "after_id": page.last_id}
    assert seen == [model.name for model in catalog]


@given(catalog=CATALOGS.filter(bool), limit=st.integers(1, 14))
def test_walking_back_by_before_id_gives_every_earlier_model_once(
    catalog: list[CatalogModel], limit: int
) -> None:
    last = catalog[-1].name
    seen: list[str] = [last]
    query = {"limit": str(limit), "before_id": last}
    while True:
        page = anthropic_page(catalog, query)
        seen = [model.id for model in page.data] + seen
        if not page.has_more:
            break
        query = {"limit": str(limit), "before_id": page.first_id}
    assert seen == [model.name for model in catalog]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"after_id": "a", "before_id": "b"}, "before_id"),
    ],
)
def test_a_bad_query_is_a_400_naming_it(query: dict[str, str], param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        anthropic_page([CatalogModel(name="a", tier="small")], query)
    assert refused.value.param == param


def test_an_unknown_cursor_gives_an_empty_page() -> None:
    catalog = [CatalogModel(name="a", tier="small")]
    for query in ({"after_id": "zz"}, {"before_id": "zz"}):
        page = anthropic_page(catalog, query)
        assert page.data == [] and not page.has_more and page.first_id is None
