"""Analytic signal-propagation theory: pure maths, no modules."""
