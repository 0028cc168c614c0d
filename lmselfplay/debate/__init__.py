"""Debate and consultancy: tasks with a known answer, the protocols, their measurement."""
