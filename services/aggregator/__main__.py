from services.aggregator.main import entry

entry()
