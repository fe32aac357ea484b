"""Simulated GPU backend: an OpenAI-compatible server with slots, TPM/RPM limits and failures.

Run it with ``python -m simbackend --port 9100`` or ``python manage.py simbackend``.
"""

from .app import SimBackendApp
from .config import SimConfig, add_arguments
from .gate import Gate
from .server import RunningSim, run, start_in_thread

__all__ = ["Gate", "RunningSim", "SimBackendApp", "SimConfig", "add_arguments", "run", "start_in_thread"]
