"""The results database: a catalogue of measured trials, device facts, calibrations and profiles.

SQLite through sqlite-utils, schema versioned by numbered migrations. Optuna's own storage holds
the studies and is the truth about trials; the `trials` table is derived from it and can be
rebuilt with `rebuild_catalogue`. The search writes it through a TrialSink (`catalogue_sink`);
report and export read it through `read_trials` and `read_table`. See docs for the schema; the
`best` view gives, per kernel × problem × dtype × device, the fastest correct config (the
finalists' latest re-timing where there is one, as report and export choose) with the default
config's time beside it.
"""

from omnitune.store._catalogue import (
    STUDY_ATTR,
    Provenance,
    StudyFacts,
    catalogue_record,
    check_storage_url,
    config_from_attrs,
    default_storage_url,
    finished_trial_attrs,
    journal_path,
    journal_unmade_on_error,
    open_optuna_storage,
    rebuild_catalogue,
    require_catalogue_held,
    result_from_attrs,
    sqlite_file_name,
    study_name,
    study_records,
    storage_description,
    storage_url_for_driver,
)
from omnitune.store._migrations import SCHEMA_VERSION, open_db, schema_version, utc_now
from omnitune.store._reading import (
    DEVICE_COLUMNS,
    read_devices,
    read_study_configs,
    read_table,
    read_trials,
    require_intact_pages,
)
from omnitune.store._records import (
    CALIBRATION_METRICS,
    TRIAL_COLUMNS,
    ProfileKind,
    ProfileRecord,
    TrialRecord,
    TrialSink,
    catalogue_sink,
    config_json,
    record_calibration,
    record_device,
    record_profile,
    record_trial,
    record_trials,
    record_search_run,
    SEARCH_RUN_COLUMNS,
    SearchRunRecord,
)

__all__ = [
    "CALIBRATION_METRICS",
    "DEVICE_COLUMNS",
    "SCHEMA_VERSION",
    "SEARCH_RUN_COLUMNS",
    "STUDY_ATTR",
    "TRIAL_COLUMNS",
    "ProfileKind",
    "ProfileRecord",
    "Provenance",
    "SearchRunRecord",
    "StudyFacts",
    "TrialRecord",
    "TrialSink",
    "catalogue_record",
    "catalogue_sink",
    "check_storage_url",
    "config_from_attrs",
    "config_json",
    "default_storage_url",
    "finished_trial_attrs",
    "journal_path",
    "journal_unmade_on_error",
    "open_db",
    "open_optuna_storage",
    "read_devices",
    "read_study_configs",
    "read_table",
    "read_trials",
    "rebuild_catalogue",
    "record_calibration",
    "record_device",
    "record_profile",
    "record_search_run",
    "record_trial",
    "record_trials",
    "require_catalogue_held",
    "require_intact_pages",
    "result_from_attrs",
    "schema_version",
    "sqlite_file_name",
    "storage_description",
    "storage_url_for_driver",
    "study_name",
    "study_records",
    "utc_now",
]
