"""The advice's fitted constants (`fitted`, written by `sigprop.advice.fit`)."""
