"""What `domaingen diagnose` measures inside a trained model; pure functions, tested by hand."""
