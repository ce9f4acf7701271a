"""What runs inside the user's training process: init, State, ElasticSampler, the elastic loop."""
