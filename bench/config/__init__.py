"""The torch-free layer the command line starts from: composing a run's configuration from conf/
and `key=value` overrides (compose), the files of conf/ and the suites (conf), the typed configs
(run), the grammar of an override (grammar), the commands, sweeps' grids and report formatting.
Importing it loads no torch, Lightning or model code: a mistyped command is answered at once."""
from bench.config.compose import compose, describe_choice, families, family_schema, field_type
from bench.config.conf import (CONF_DIR, MAX_RUNS, choices, conf_file, conf_relative,
                               default_choices, is_suite_path, load_suite, suite_files, suite_label)
from bench.config.errors import CheckFailed, ConfigError, first_line, shown
from bench.config.grammar import (GROUPS, check_override, check_path, check_value, entry_numbers,
                                  load_yaml_text, parse_seed, yaml_problem)
from bench.config.run import PRECISIONS, RunConfig, TrainerConfig

__all__ = ["compose", "describe_choice", "family_schema", "field_type", "families", "CONF_DIR",
           "MAX_RUNS", "choices", "conf_file", "conf_relative", "default_choices", "is_suite_path",
           "load_suite", "suite_files", "suite_label", "CheckFailed", "ConfigError", "first_line",
           "shown", "GROUPS", "check_override", "check_path", "check_value", "entry_numbers",
           "load_yaml_text", "parse_seed", "yaml_problem", "PRECISIONS", "RunConfig",
           "TrainerConfig"]
