from services.notifier.main import entry

entry()
