#!/usr/bin/env python3
"""The proxy's libraries and what each may include.

Each library's compile sees only its own folder and the folders of the
libraries it depends on (src/*/meson.build), so a header of a layer above
is not found. This check states the same order in one place and also
refuses the two ways around it: a relative path ("../client/h1_codec.hpp")
and a private header that names another library's folder. Inside
src/client, the HTTP/1.1 and HTTP/2 codecs include each other's header
not at all.

    wire      the bytes on the wire          knows nothing above it
    exchange  the exchange and its seams     wire
    client    the client codecs              exchange, wire
    adapters  the backend adapters           exchange, wire
    proxy     the policy, composition root   all of the above

usage: layers.py SOURCE_ROOT
"""
import pathlib
import re
import sys

ALLOWED = {
    'wire': {'wire'},
    'exchange': {'exchange', 'wire'},
    'client': {'client', 'exchange', 'wire'},
    'adapters': {'adapters', 'exchange', 'wire'},
    'proxy': {'proxy', 'client', 'adapters', 'exchange', 'wire'},
}
# Inside a library: the HTTP/1.1 and HTTP/2 codecs meet only through
# transport.hpp (conn_transport, conn_protocol).
APART = [('h1_', 'h2_codec.hpp'), ('h2_', 'h1_codec.hpp')]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main() -> int:
    src = pathlib.Path(sys.argv[1]) / 'src'
    # Which library owns each private header (by bare name: the libraries'
    # include folders are flat, so a name must be unique among them).
    owner = {}
    problems = []
    for lib in ALLOWED:
        for h in (src / lib).glob('*.hpp'):
            if h.name in owner:
                problems.append(f'{h.name}: in both src/{owner[h.name]} and src/{lib}')
            owner[h.name] = lib
    files = 0
    for lib, allowed in ALLOWED.items():
        for f in sorted((src / lib).glob('*.[ch]pp')):
            files += 1
            for inc in INCLUDE.findall(f.read_text()):
                rel = f'src/{lib}/{f.name}'
                if inc.startswith('sluice/'):
                    continue  # a module's public header (include/)
                if '/' in inc or inc.startswith('.'):
                    problems.append(f'{rel}: includes "{inc}": a private header by its bare name only')
                    continue
                if any(f.name.startswith(prefix) and inc == other for prefix, other in APART):
                    problems.append(f'{rel}: includes "{inc}": the codecs meet through transport.hpp')
                    continue
                lib_of = owner.get(inc)
                if lib_of is None:
                    problems.append(f'{rel}: includes "{inc}", which no proxy library holds')
                elif lib_of not in allowed:
                    problems.append(f'{rel}: includes "{inc}" of src/{lib_of}; src/{lib} may include '
                                    + ', '.join(sorted(allowed)))
    if files == 0:
        problems.append(f'no sources found under {src}')
    for p in problems:
        print(p)
    print(f'{files} files in {len(ALLOWED)} libraries, {len(problems)} problems')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
