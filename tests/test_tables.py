"""Tables print the same cells with rich and as plain text; model output is never read as rich markup."""

import pytest

from dapo_jax.tables import have_rich, print_table


@pytest.mark.parametrize("plain", [True, False])
def test_cells_survive(capsys, plain):
    if not plain and not have_rich():
        pytest.skip("rich is not installed")
    print_table("title", ["a", "text"], [[1, "[bold]x[/bold] y"], [22, "two\nlines"]], plain=plain, wrap=[1])
    out = capsys.readouterr().out
    assert "title" in out and "[bold]x[/bold] y" in out and "two" in out and "lines" in out and "22" in out
