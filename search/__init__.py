"""knobtune's engine: study files, Optuna studies, isolated trials, export. Framework-free."""
