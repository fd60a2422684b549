"""What a search found: the results database turned into a DataFrame, and that frame rendered.

Pure functions over pandas, in three modules: `frame` reads the database through omnitune.store
(read-only: reporting never creates or migrates one) — `load_trials`, `load_calibrations`,
`load_profiles` — reduces the trials to one row per kernel × problem × dtype × device
(`best_per_key`) and picks the columns a person reads (`summarize`), with each result placed on
its device's measured roofline and beside its ncu profile; `render` turns a summary into a rich
table, CSV, Markdown or JSON; `figures` draws the PNGs of omnitune.profile.plots. The CLI
(omnitune/cli/tables_cmd.py) only chooses among them; omnitune.export builds on `best_per_key`.
"""

from omnitune.report.figures import FiguresWritten, problem_defaults_of, write_figures
from omnitune.report.frame import (
    CALIBRATE_HINT,
    KEY_COLUMNS,
    NCU_COLUMNS,
    NOT_REPRESENTATIVE_MARK,
    NOT_REPRESENTATIVE_NOTE,
    PROFILE_COLUMNS,
    SUMMARY_COLUMNS,
    TRIAL_COLUMNS,
    best_per_key,
    calibration_note,
    failure_summary,
    impossible_times,
    in_any_column,
    in_whole_sessions,
    load_calibrations,
    load_devices,
    load_profiles,
    load_trials,
    profile_per_key,
    profiles_for,
    roofline_columns,
    roofline_point_of,
    search_trials,
    summarize,
    uncalibrated_devices,
    with_retiming,
)
from omnitune.report.render import (
    NOISY_MARK,
    display_frame,
    profile_display_frame,
    render_csv,
    render_json,
    render_markdown,
    render_table,
)

__all__ = [
    "CALIBRATE_HINT", "KEY_COLUMNS", "NCU_COLUMNS", "NOISY_MARK", "NOT_REPRESENTATIVE_MARK",
    "NOT_REPRESENTATIVE_NOTE", "PROFILE_COLUMNS", "SUMMARY_COLUMNS", "TRIAL_COLUMNS", "FiguresWritten",
    "best_per_key", "calibration_note", "display_frame", "failure_summary", "impossible_times", "in_any_column",
    "in_whole_sessions", "load_calibrations", "load_devices",
    "load_profiles", "load_trials", "problem_defaults_of", "profile_display_frame", "profile_per_key",
    "profiles_for", "render_csv", "render_json", "render_markdown", "render_table", "roofline_columns",
    "roofline_point_of", "search_trials", "summarize", "uncalibrated_devices", "with_retiming", "write_figures",
]
