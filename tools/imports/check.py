#!/usr/bin/env python3
"""Every module a target imports is one it declares in Package.swift (SwiftPM's own
--explicit-target-dependency-import-check does not check with the build system of Swift 6.3 here, so this does).

Usage: python3 tools/imports/check.py   (from the repository root; exit 1 with one line per target otherwise)."""
import glob
import re
import sys

STANDARD = {"Foundation", "FoundationEssentials", "FoundationNetworking", "Glibc", "Musl", "Darwin", "Dispatch",
            "Testing", "XCTest", "Synchronization"}


def targets(manifest: str) -> dict[str, tuple[str, set[str]]]:
    found = {}
    pattern = r'\.(target|executableTarget|testTarget|systemLibrary)\(\s*name:\s*"([^"]+)"(.*?)\n        \)'
    for kind, name, body in re.findall(pattern, manifest, re.S):
        deps = set(re.findall(r'\.product\(name:\s*"([^"]+)"', body))
        listed = re.search(r'dependencies:\s*\[(.*?)\]', body, re.S)
        if listed:
            plain = re.sub(r'\.product\([^)]*\)', '', listed.group(1))
            deps |= set(re.findall(r'"([A-Za-z][\w-]*)"', plain))
        path = re.search(r'path:\s*"([^"]+)"', body)
        found[name] = (path.group(1) if path else ("Tests/" if kind == "testTarget" else "Sources/") + name, deps)
    return found


def imports(path: str) -> set[str]:
    names = set()
    for source in glob.glob(path + "/**/*.swift", recursive=True):
        with open(source, encoding="utf-8") as f:
            for line in f:
                m = re.match(r'(?:@testable |@preconcurrency |package |public |internal )*import (?:struct |enum |class |func )?(\w+)', line)
                if m:
                    names.add(m.group(1))
    return names


def main() -> int:
    with open("Package.swift", encoding="utf-8") as f:
        declared = targets(f.read())
    failed = False
    for name, (path, deps) in sorted(declared.items()):
        missing = sorted(imports(path) - deps - STANDARD - {name})
        if missing:
            failed = True
            print(f"{name} ({path}) imports {', '.join(missing)} without declaring it in Package.swift")
    print(f"imports: {len(declared)} targets checked: {'FAILED' if failed else 'every import declared'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
