"""jsonfields.Fields: typed reads of untrusted JSON that fail with the caller's error type, naming file and field."""
import pytest

from tinychat.jsonfields import Fields, is_int, show


class Bad(ValueError):
    pass


def test_a_wrong_type_names_the_nested_field_and_shows_the_value_on_one_line():
    f = Fields({"m": {"ids": [1, 2, "x\ny"]}}, "chat.json", error=Bad)
    with pytest.raises(Bad, match=r"^chat\.json: field m\.ids\[2\] must be an id, got 'x\\ny'$"):
        f.at(f.data["m"], "m.").int_list("ids", is_int, "an id")


def test_missing_optional_and_nullable_fields():
    f = Fields({"a": None}, "f", defaults={"rev": 0})
    assert f.optional("rev", is_int, "an integer") == 0
    assert f.get("a", is_int, "an integer", nullable=True) is None
    with pytest.raises(ValueError, match="field a must be an integer, got None"):
        f.get("a", is_int, "an integer")
    with pytest.raises(ValueError, match="^f: missing field b$"):
        f.get("b", is_int, "an integer")
    assert show(True) == "True" and show({"k": 1}) == "an object" and show("z" * 50).endswith("...")
