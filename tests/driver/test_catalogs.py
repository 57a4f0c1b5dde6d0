"""lakesink.driver.catalogs: the embedded default catalog, named catalogs, ${VAR} expansion, secret-free errors."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
import strictyaml
from pyiceberg.catalog.sql import SqlCatalog

from lakesink.driver import catalogs
from lakesink.errors import CatalogError

REPO = Path(__file__).resolve().parents[2]


# --- the embedded default -------------------------------------------------------------------------


def test_embedded_default_is_created_under_lakesink_home(
    isolated_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "not-yet" / "lakehouse"
    monkeypatch.setenv("LAKESINK_HOME", str(home))

    catalog = catalogs.load(None, {})

    assert isinstance(catalog, SqlCatalog)
    assert catalog.name == "lakesink"
    assert (home / "catalog.db").is_file()
    assert (home / "warehouse").is_dir()
    assert dict(catalog.properties) == {
        "type": "sql",
        "uri": f"sqlite:///{home}/catalog.db",
        "warehouse": f"file://{home}/warehouse",
    }
    # it works: a table made in it lands in the warehouse folder
    catalog.create_namespace("db")
    table = catalog.create_table(("db", "t"), schema=pa.schema([pa.field("id", pa.int64())]))
    assert table.location() == f"file://{home}/warehouse/db/t"
    assert catalogs.load(None, {}).load_table(("db", "t")).metadata.table_uuid == table.metadata.table_uuid


def test_embedded_default_is_loaded_once_per_process(
    isolated_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAKESINK_HOME", str(tmp_path / "home-a"))
    first = catalogs.load(None, {})
    assert catalogs.load(None, {}) is first
    monkeypatch.setenv("LAKESINK_HOME", str(tmp_path / "home-b"))
    other = catalogs.load(None, {})
    assert other is not first
    assert other.properties["uri"] == f"sqlite:///{tmp_path}/home-b/catalog.db"


def test_relative_lakesink_home_is_made_absolute(isolated_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKESINK_HOME", "rel/home")
    assert catalogs.lakesink_home() == isolated_config / "rel" / "home"
    name, props = catalogs.resolve_catalog_properties(None, {})
    assert name == "lakesink"
    assert props == {
        "type": "sql",
        "uri": f"sqlite:///{isolated_config}/rel/home/catalog.db",
        "warehouse": f"file://{isolated_config}/rel/home/warehouse",
    }


def test_lakesink_home_defaults_to_lakehouse_in_the_working_folder(
    isolated_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LAKESINK_HOME", raising=False)
    assert catalogs.lakesink_home() == isolated_config / "lakehouse"
    monkeypatch.setenv("LAKESINK_HOME", "")
    assert catalogs.lakesink_home() == isolated_config / "lakehouse"


def test_repository_pyiceberg_yaml_defines_the_embedded_catalog() -> None:
    document = strictyaml.load((REPO / "catalog" / ".pyiceberg.yaml").read_text(encoding="utf-8")).data
    assert list(document) == ["catalog"]
    assert dict(document["catalog"]["lakesink"]) == dict(catalogs.EMBEDDED_CATALOG_PROPERTIES)


def test_repository_pyiceberg_yaml_resolves_like_the_embedded_default(
    isolated_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAKESINK_HOME", str(tmp_path / "home"))
    embedded = catalogs.resolve_catalog_properties(None, {})
    monkeypatch.setenv("PYICEBERG_HOME", str(REPO / "catalog"))
    assert catalogs.resolve_catalog_properties("lakesink", {}) == embedded
    assert catalogs.resolve_catalog_properties(None, {}) == embedded


# --- ${VAR} expansion -----------------------------------------------------------------------------


def test_expand_variables_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIT_DB_HOST", "db.example.com")
    monkeypatch.delenv("UNIT_DB_PORT", raising=False)
    assert catalogs.expand("postgresql://${UNIT_DB_HOST}:${UNIT_DB_PORT:-5432}/x") == ("postgresql://db.example.com:5432/x")
    assert catalogs.expand("${UNIT_DB_PORT:-}") == ""
    assert catalogs.expand("${UNIT_DB_HOST:-other}") == "db.example.com"
    assert catalogs.expand("no variables, $UNIT_DB_HOST or {UNIT_DB_HOST}") == ("no variables, $UNIT_DB_HOST or {UNIT_DB_HOST}")


def test_expand_default_applies_to_an_empty_variable_as_in_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    # ${VAR:-default} is the shell's form: the default applies when VAR is unset *or empty*
    monkeypatch.setenv("UNIT_EMPTY", "")
    assert catalogs.expand("${UNIT_EMPTY:-fallback}") == "fallback"


def test_expand_lakesink_home_is_absolute(isolated_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKESINK_HOME", "./here")
    assert catalogs.expand("${LAKESINK_HOME}/catalog.db") == f"{isolated_config}/here/catalog.db"


def test_unset_variable_is_an_error_naming_it(isolated_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNIT_UNSET_SECRET", raising=False)
    with pytest.raises(CatalogError) as e:
        catalogs.expand("${UNIT_UNSET_SECRET}")
    assert str(e.value) == "catalog property refers to environment variable ${UNIT_UNSET_SECRET}, which is not set"


def test_unset_variable_error_names_the_catalog_property(isolated_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNIT_UNSET_SECRET", raising=False)
    with pytest.raises(CatalogError) as e:
        catalogs.load(None, {"type": "rest", "uri": "http://rest:8181", "credential": "id:${UNIT_UNSET_SECRET}"})
    message = str(e.value)
    assert "${UNIT_UNSET_SECRET}" in message
    assert "credential" in message  # which property to fix


def test_overrides_are_expanded(isolated_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIT_WAREHOUSE_ROOT", str(tmp_path / "wh-root"))
    monkeypatch.delenv("UNIT_CATALOG_FILE", raising=False)
    name, props = catalogs.resolve_catalog_properties(
        None,
        {
            "type": "sql",
            "uri": f"sqlite:///${{UNIT_CATALOG_FILE:-{tmp_path}/expanded.db}}",
            "warehouse": "file://${UNIT_WAREHOUSE_ROOT}/wh",
        },
    )
    assert name == "lakesink"
    assert props == {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/expanded.db",
        "warehouse": f"file://{tmp_path}/wh-root/wh",
    }
    catalog = catalogs.load(
        None,
        {
            "type": "sql",
            "uri": f"sqlite:///${{UNIT_CATALOG_FILE:-{tmp_path}/expanded.db}}",
            "warehouse": "file://${UNIT_WAREHOUSE_ROOT}/wh",
        },
    )
    assert (tmp_path / "expanded.db").is_file()
    assert (tmp_path / "wh-root" / "wh").is_dir()
    assert catalog.list_namespaces() == []


# --- named catalogs -------------------------------------------------------------------------------


def test_named_catalog_from_environment_variables(isolated_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # set after pyiceberg was imported: lakesink reads pyiceberg's configuration at call time
    monkeypatch.setenv("PYICEBERG_CATALOG__UNITENV__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__UNITENV__URI", f"sqlite:///{tmp_path}/env/catalog.db")
    monkeypatch.setenv("PYICEBERG_CATALOG__UNITENV__WAREHOUSE", f"file://{tmp_path}/env/warehouse")

    assert catalogs.resolve_catalog_properties("unitenv", {}) == (
        "unitenv",
        {"type": "sql", "uri": f"sqlite:///{tmp_path}/env/catalog.db", "warehouse": f"file://{tmp_path}/env/warehouse"},
    )
    catalog = catalogs.load("unitenv", {})
    assert isinstance(catalog, SqlCatalog)
    assert catalog.name == "unitenv"
    assert (tmp_path / "env" / "catalog.db").is_file()
    assert (tmp_path / "env" / "warehouse").is_dir()
    catalog.create_namespace("db")
    assert catalog.list_namespaces() == [("db",)]


def test_named_catalog_from_a_pyiceberg_yaml_with_overrides_on_top(
    isolated_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyiceberg-home" / ".pyiceberg.yaml").write_text(
        "catalog:\n"
        "  unityaml:\n"
        "    type: sql\n"
        f"    uri: sqlite:///{tmp_path}/yaml.db\n"
        f"    warehouse: file://{tmp_path}/yaml-wh\n",
        encoding="utf-8",
    )
    assert catalogs.resolve_catalog_properties("unityaml", {"warehouse": f"file://{tmp_path}/override-wh"}) == (
        "unityaml",
        {"type": "sql", "uri": f"sqlite:///{tmp_path}/yaml.db", "warehouse": f"file://{tmp_path}/override-wh"},
    )


def test_undefined_catalog_says_how_to_define_it(isolated_config: Path) -> None:
    with pytest.raises(CatalogError) as e:
        catalogs.load("nosuchcat", {})
    assert str(e.value) == (
        "catalog 'nosuchcat' is not defined: add it to .pyiceberg.yaml (in $PYICEBERG_HOME, ~ or the working "
        "folder) or set PYICEBERG_CATALOG__NOSUCHCAT__TYPE/URI/..., or pass catalog.<property> options; "
        "known catalogs: none"
    )


def test_undefined_catalog_lists_the_known_ones(isolated_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYICEBERG_CATALOG__ALPHA__URI", "http://a:8181")
    monkeypatch.setenv("PYICEBERG_CATALOG__BETA__URI", "http://b:8181")
    with pytest.raises(CatalogError) as e:
        catalogs.load("gamma", {})
    assert str(e.value).endswith("known catalogs: alpha, beta")


def test_undefined_catalog_advice_names_a_settable_variable(
    isolated_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variable the message suggests can be exported from a shell, and it defines that very catalog."""
    with pytest.raises(CatalogError) as e:
        catalogs.load("unit-cat", {})
    found = re.search(r"set (PYICEBERG_CATALOG__\S+?)__TYPE/URI", str(e.value))
    assert found is not None, str(e.value)
    prefix = found.group(1)
    assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", prefix), f"{prefix} is not a valid environment variable name"
    monkeypatch.setenv(f"{prefix}__TYPE", "sql")
    monkeypatch.setenv(f"{prefix}__URI", f"sqlite:///{tmp_path}/advice.db")
    monkeypatch.setenv(f"{prefix}__WAREHOUSE", f"file://{tmp_path}/advice-wh")
    assert catalogs.load("unit-cat", {}).name == "unit-cat"


# --- errors do not leak secrets -------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri",
    [
        "mysql://admin:Hunter2Secret@db.example.com/iceberg",
        "mysql://:Hunter2Secret@db.example.com/iceberg",
    ],
)
def test_broken_catalog_error_does_not_contain_the_password(isolated_config: Path, uri: str) -> None:
    # no type and a URI pyiceberg cannot infer a type from: pyiceberg's error quotes the URI
    with pytest.raises(CatalogError) as e:
        catalogs.load("unitbroken", {"uri": uri, "s3.secret-access-key": "wJalrXUtnFEMIK7MDENG"})
    message = str(e.value)
    assert message.startswith("cannot load catalog 'unitbroken': ValueError: Could not infer the catalog type")
    assert "Hunter2Secret" not in message
    assert "wJalrXUtnFEMIK7MDENG" not in message
    assert "db.example.com/iceberg" in message  # the rest of the URI stays, to find the mistake
    assert e.value.__cause__ is None and e.value.__suppress_context__  # the original text is not chained


def test_broken_catalog_error_masks_a_password_given_through_a_variable(
    isolated_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNIT_DB_PASSWORD", "Env-Hunter2-Secret")
    with pytest.raises(CatalogError) as e:
        catalogs.load("unitbroken", {"uri": "mysql://admin:${UNIT_DB_PASSWORD}@db.example.com/iceberg"})
    assert str(e.value) == (
        "cannot load catalog 'unitbroken': ValueError: Could not infer the catalog type from the uri: "
        "mysql://admin:***@db.example.com/iceberg"
    )


def test_catalog_name_option_names_the_catalog(isolated_config: Path, tmp_path: Path) -> None:
    props = {"name": "mine", "type": "sql", "uri": f"sqlite:///{tmp_path}/named.db", "warehouse": f"file://{tmp_path}"}
    catalog = catalogs.load(None, props)
    assert catalog.name == "mine"
    assert catalog.list_namespaces() == []


def test_repository_shared_catalog_works_on_a_real_postgresql(
    isolated_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres: object
) -> None:
    """catalog/.pyiceberg.yaml's `shared` definition, with its ${VAR}s set, against a real PostgreSQL server."""
    uri = postgres.create_database()  # type: ignore[attr-defined]
    database = uri.rsplit("/", 1)[1]
    monkeypatch.setenv("PYICEBERG_HOME", str(REPO / "catalog"))
    monkeypatch.setenv("LAKESINK_PG_USER", "postgres")
    monkeypatch.setenv("LAKESINK_PG_PASSWORD", "unused-with-trust-auth")
    monkeypatch.setenv("LAKESINK_PG_HOST", "127.0.0.1")
    monkeypatch.setenv("LAKESINK_PG_PORT", str(postgres.port))  # type: ignore[attr-defined]
    monkeypatch.setenv("LAKESINK_PG_DATABASE", database)
    monkeypatch.setenv("LAKESINK_WAREHOUSE", f"file://{tmp_path}/wh")
    name, props = catalogs.resolve_catalog_properties("shared", {})
    assert props["uri"] == f"postgresql+psycopg2://postgres:unused-with-trust-auth@127.0.0.1:{postgres.port}/{database}"  # type: ignore[attr-defined]
    catalog = catalogs.load("shared", {})
    catalog.create_namespace("db")
    table = catalog.create_table(("db", "t"), schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": [1, 2]}))
    assert catalogs.load("shared", {}).load_table(("db", "t")).scan().to_arrow().num_rows == 2
    assert name == "shared"
