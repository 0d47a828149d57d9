"""Shared test helpers: the real CLI in a subprocess (``cli``), tree snapshots (``trees``), sealed sample
artifacts (``artifacts``), tiny real models (``tiny_models``), the loopback servers (``servers``),
memory sampling (``memory``), moto with real bodies (``moto_bodies``), small tmpfs disks (``disks``),
processes forked from preloaded templates (``preloaded``, ``job_launcher``), jobs started and killed whole
(``procs``), the single-node Slurm (``slurm``), the site's browser (``browser``), one apt-get at a time
(``apt``) and the docs' fenced blocks (``markdown``)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
