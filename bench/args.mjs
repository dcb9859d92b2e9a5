// Command-line flags of the bench node scripts: "--name value" pairs into
// an object; other words go to `_`, or are refused with { positional: false }.
export function parse_args(argv, { positional = true } = {}) {
  const out = { _: [] };
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i].startsWith('--')) {
      out[argv[i].slice(2)] = argv[++i];
    } else if (positional) {
      out._.push(argv[i]);
    } else {
      throw new Error(`unexpected argument ${argv[i]}`);
    }
  }
  return out;
}
