import json


def scan_json(report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n"
