"""What every analysis shares: the examples and how they are encoded (`examples`), batching for
the forward passes (`forward`), figure machinery (`figures`) and hypothesis tests (`stats`)."""
