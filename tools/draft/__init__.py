"""The project's own draft for the embedded target: offline prompts, teacher data, training,
evaluation. The served model is adaserve_backend/models/feature_draft.py."""
