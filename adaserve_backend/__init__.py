from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout: model_repository/, runs/, .venv/
