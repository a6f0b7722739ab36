"""One run: build the task and model, train with Lightning, evaluate against the references,
write the record; and the checks a run passes before it starts."""
