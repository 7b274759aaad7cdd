"""Where a run's files are: the packaged recipes by name, and relative paths resolved against the repository."""

from dapo_jax.training.config.paths import CONFIG_DIR, REPO_ROOT, recipes, resolve_path


def test_recipes_are_the_packaged_yaml_files_by_name():
    names = recipes()
    assert names == sorted(p.name[:-len(".yaml")] for p in CONFIG_DIR.iterdir() if p.name.endswith(".yaml"))
    assert "tiny_dapo" in names and "objectives" not in names  # the objective recipes are a folder of their own


def test_resolve_path_prefers_what_exists_then_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the checkout
    (tmp_path / "here.txt").write_text("x")
    assert resolve_path("here.txt").name == "here.txt" and not resolve_path("here.txt").is_absolute()
    assert resolve_path("dapo_jax/configs/tiny_dapo.yaml") == REPO_ROOT / "dapo_jax" / "configs" / "tiny_dapo.yaml"
    assert str(resolve_path("nowhere/at/all")) == "nowhere/at/all"  # neither: as given, for the caller's error
    assert resolve_path(tmp_path / "absent") == tmp_path / "absent"  # absolute: as given
