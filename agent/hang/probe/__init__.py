"""The probe every Python rank runs (sitecustomize.py: imported by Python at start-up)."""
