"""The tuning key is declared once (verify_tuner.keys) and everything that stores, asks for or names
a key is made from that declaration: the keyed tables' columns, the API's query parameters, the
import/export row schema, the engine file's name and document, the study name and the caches. A
field added to a key type reaches each of them without their code changing (WithPageSize below)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from verify_tuner.api.key_query import KeyQuery, parameters
from verify_tuner.engine_files import doc_key_values, file_name, key_doc
from verify_tuner.kernels.formats import FORMATS, KV_DTYPES
from verify_tuner.keys import ConfigKey, Spec, TableKey, check_kv_dtype, specs
from verify_tuner.store.configs_io import FIELDS
from verify_tuner.store.keyed import key_columns, row_key
from verify_tuner.store.models import BestConfig, GraphPlan, Study, Verification, key_column, key_column_names
from verify_tuner.store.row_schema import COLUMNS, ConfigRow, table_key_fields

KEY = ConfigKey("NVIDIA H200", "k" * 16, "bf16", 8, 9, 15, 3)
TABLE_FIELDS = [f.name for f, _ in specs(TableKey)]
KEY_FIELDS = [f.name for f, _ in specs(ConfigKey)]


@dataclasses.dataclass(frozen=True, order=True)
class WithPageSize(TableKey):
    """A table key with a dimension added the way docs/architecture.md says: a default that the
    rows and names made before it mean, left out of those names at that default, keyword-only (so
    every positional construction of a key, and ConfigKey's fields after it, stay as they are)."""

    page: int = dataclasses.field(
        default=1,
        kw_only=True,
        metadata={"spec": Spec("KV page size", tag="P", lo=1, hi=256, default=1, added=True, file=(4, "page"))},
    )


@dataclasses.dataclass(frozen=True, order=True)
class PagedConfigKey(WithPageSize):
    """ConfigKey's own fields over WithPageSize, as they would sit over a TableKey that gained `page`."""

    bucket: int = dataclasses.field(metadata=dict(dataclasses.fields(ConfigKey)[-2].metadata))
    batch_bucket: int = dataclasses.field(default=0, metadata=dict(dataclasses.fields(ConfigKey)[-1].metadata))


def test_the_keyed_tables_have_one_column_a_key_field():
    assert key_column_names() == ["device_id", "kernel_id", "kv_dtype", "H", "q_len", "bucket", "batch_bucket"]
    for model in (Study, BestConfig, Verification):
        assert set(key_column_names()) <= set(model.__table__.c.keys()), model
    assert set(key_column_names(TableKey)) | {"batch_bucket"} <= set(GraphPlan.__table__.c.keys())
    (unique,) = [c for c in BestConfig.__table__.constraints if c.name == "uq_best_key"]
    assert [c.name for c in unique.columns] == key_column_names()
    for model in (Study, BestConfig, GraphPlan, Verification):  # existing rows are bf16 (migration 0006)
        assert model.__table__.c.kv_dtype.server_default.arg == "bf16"
    assert set(key_columns(1, 2, KEY)) == set(key_column_names())


def test_a_row_reads_back_as_its_key():
    class Row:  # a table row's attributes, as select_keyed hands one over with its device and kernel names
        kv_dtype, H, q_len, bucket, batch_bucket = "bf16", 8, 9, 15, 3

    assert row_key(Row(), KEY.device, KEY.kernel_hash, ConfigKey) == KEY
    assert row_key(Row(), KEY.device, KEY.kernel_hash, TableKey) == KEY.table


def test_the_api_takes_every_table_key_field_with_its_bounds_and_description():
    from verify_tuner.api.app import create_app
    from verify_tuner.settings import Settings

    spec = create_app(Settings(database_url="sqlite://")).openapi()
    for path in ("/config", "/configs"):
        params = {p["name"]: p for p in spec["paths"][path]["get"]["parameters"]}
        for f, s in specs(TableKey):
            assert params[f.name]["description"] == s.doc, (path, f.name)
            assert params[f.name]["required"] is (s.default is None and not s.local), (path, f.name)
        assert (params["H"]["schema"]["ge"], params["H"]["schema"]["le"], params["q_len"]["schema"]["le"]) == (
            1,
            1024,
            64,
        )
        assert params["kv_dtype"]["schema"]["default"] == "bf16"
        assert params["dtype"]["deprecated"] is True  # kv_dtype's former name, still read


def test_the_row_schema_and_the_export_columns_hold_every_key_field(monkeypatch):
    assert set(KEY_FIELDS) <= set(ConfigRow.model_fields)
    assert FIELDS[: len(TABLE_FIELDS) + 1] == [*TABLE_FIELDS, "bucket"] and "batch_bucket" in FIELDS
    assert "dtype" in COLUMNS  # files exported before the rename still import
    row = {"device": "h200", "H": 8, "q_len": 9, "bucket": 15, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256}
    row |= {"STAGES": 2, "QT": 0, "WR": 2, "WK": 4, "SF": 0, "PIPE": 1}  # an import row gives all ten
    assert ConfigRow.model_validate(row).table_values()["kv_dtype"] == "bf16"  # left out: bf16
    assert ConfigRow.model_validate(row | {"dtype": "bf16"}).table_values()["kv_dtype"] == "bf16"
    assert ConfigRow.model_validate(row | {"kv_dtype": "fp8_e4m3"}).table_values()["kv_dtype"] == "fp8_e4m3"
    assert ConfigRow.model_validate(row | {"kv_dtype": "fp8_ds_mla"}).table_values()["kv_dtype"] == "fp8_ds_mla"
    monkeypatch.setitem(
        FORMATS, "fp8_e5m2", dataclasses.replace(FORMATS["fp8_e4m3"], name="fp8_e5m2", kernel_reads=False)
    )
    with pytest.raises(ValueError, match="not read by this kernel version yet"):
        ConfigRow.model_validate(row | {"kv_dtype": "fp8_e5m2"})


def test_the_engine_file_names_every_field_but_the_kernel_and_its_document_every_field():
    table = KEY.table
    assert file_name(table) == "H=8,q_len=9,device_name=NVIDIA_H200,dtype=bf16.json"  # vLLM's naming, as before
    for f, s in specs(TableKey):
        if f.name == "kv_dtype":
            continue  # no second format is accepted yet: its place in the name, dtype=, is checked above
        value = getattr(table, f.name)
        changed = dataclasses.replace(table, **{f.name: value + 1 if isinstance(value, int) else value + "x"})
        assert (file_name(changed) != file_name(table)) is (s.file is not None), f.name
    assert doc_key_values(key_doc(table)) == table.values()


def test_study_names_and_cache_keys_are_the_keys_text():
    from verify_tuner.space import SPACE_VERSION

    assert KEY.study_name == f"verify-s{SPACE_VERSION}:{KEY}"
    assert str(KEY) == "NVIDIA H200|kkkkkkkkkkkkkkkk|bf16|H8|Q9|b15|B3" and ConfigKey.parse(str(KEY)) == KEY
    query = KeyQuery(tuple(KEY.table.values().items()))
    assert query.key() == KEY.table and hash(query) == hash(KeyQuery(tuple(KEY.table.values().items())))


def test_a_new_dimension_reaches_every_derived_place():
    old, paged = WithPageSize(**KEY.table.values()), WithPageSize(**KEY.table.values(), page=16)
    # names made before it still name the same table: the file, the text form (study names) and its parse
    assert file_name(old) == file_name(KEY.table) and str(old) == str(KEY.table)
    assert file_name(paged).endswith(",page=16.json") and str(paged).endswith("|P16")
    assert WithPageSize.parse(str(paged)) == paged and WithPageSize.parse(str(old)) == old
    # a stored best's key: positional as before, the new field named; its study name as before at the default
    key = PagedConfigKey(*KEY.values().values())
    assert str(key) == str(KEY) and str(PagedConfigKey(*KEY.values().values(), page=16)) == f"{KEY.table}|P16|b15|B3"
    # a file written before it existed reads at its default
    assert doc_key_values(key_doc(KEY.table)) | {"page": 1} == old.values()
    # a column, a query parameter and a row column with its bounds and default
    assert key_column_names(WithPageSize)[-1] == "page"
    page = {f.name: s for f, s in specs(WithPageSize)}["page"]
    assert key_column("page", page, int).column.server_default.arg == "1"
    api = {p.name: p for p in parameters(WithPageSize)}
    assert api["page"].default == 1 and api["page"].kind is inspect.Parameter.KEYWORD_ONLY
    annotation, default = table_key_fields(WithPageSize)["page"]
    assert default == 1 and "le=256" in repr(annotation)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_kv_format_the_kernel_reads_is_a_key(name):
    assert name in KV_DTYPES
    assert check_kv_dtype(name) == name and ConfigKey("d", "k", name, 8, 9, 1).kv_dtype == name


def test_a_kv_format_the_kernel_does_not_read_is_refused_by_name(monkeypatch):
    """A format listed ahead of its kernel code is refused with why, naming the accepted ones."""
    monkeypatch.setitem(
        FORMATS, "fp8_e5m2", dataclasses.replace(FORMATS["fp8_e4m3"], name="fp8_e5m2", kernel_reads=False)
    )
    with pytest.raises(ValueError, match="kv_dtype fp8_e5m2 .*not read by this kernel version yet.*accepted: bf16"):
        ConfigKey("d", "k", "fp8_e5m2", 8, 9, 1)


def test_an_unknown_kv_format_names_the_accepted_ones():
    with pytest.raises(ValueError, match="unknown kv_dtype 'fp16': accepted: bf16"):
        TableKey("d", "k", "fp16", 8, 9)
