"""What a run leaves behind, and whom it tells: the per-cycle summary
(``summary``), the printed and written report (``report``), the trackers
(``tracking``: TensorBoard, W&B, MLflow, Trackio), the exported tables
(``export``) and the run's log file (``run_log``)."""
