"""HTTP sidecar: answers config lookups from the database the tuner fills."""
