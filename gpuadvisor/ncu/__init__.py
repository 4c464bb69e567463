"""``gpuadvisor ncu``: shared-memory counters from Nsight Compute, and rule GA502 on them.

``counters`` parses an ``ncu --csv`` export into a per-kernel table and holds the GA502 detector; ``run``
profiles a model.py under ``ncu --clock-control none`` (through ``python -m gpuadvisor.ncu.child``) or imports
an existing CSV, and renders the report. Standard library only (plus rich for the terminal).
"""
