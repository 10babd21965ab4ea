package storeurl

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// mask replaces a secret in descriptions and errors.
const mask = "xxxxx"

// minFragment is the shortest piece of a password that a message may not
// show: a parser may quote any part of a malformed URL (see scrub).
const minFragment = 3

// Describe returns raw with every password replaced by "xxxxx", for logs and
// output. It works on malformed URLs and on libpq key=value strings too: when
// raw does not parse cleanly as a URL, everything before the last '@' (user
// information) is masked, whatever the characters in it.
func Describe(raw string) string {
	raw = strings.TrimSpace(raw)
	if conninfo.MatchString(raw) {
		return maskKeyValues(raw)
	}
	if clean, ok := parseClean(raw); ok {
		return describeURL(clean)
	}
	return maskKeyValues(describeRaw(raw))
}

// parseClean parses raw as a URL, and reports whether the parse can be
// trusted to have found the user information: a scheme, and either no '@'
// at all or exactly one '@' that ended up in the user information. A
// password with an unescaped '#', '?' or '/' fails this test (url.Parse
// takes the rest for a fragment, query or path).
func parseClean(raw string) (*url.URL, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return nil, false
	}
	switch n := strings.Count(raw, "@"); {
	case n == 0:
		return u, u.User == nil
	case n == 1:
		return u, u.User != nil
	}
	return nil, false
}

func describeURL(u *url.URL) string {
	q := u.Query()
	changed := false
	for k := range q {
		if isSecretParam(k) {
			q.Set(k, mask)
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// describeRaw masks the user information of a string url.Parse would
// misread: the scheme is kept when it looks like one, the user name when it
// is plain, and everything else up to the last '@' becomes "xxxxx".
func describeRaw(raw string) string {
	at := strings.LastIndex(raw, "@")
	if at < 0 {
		return raw
	}
	prefix, user := "", ""
	if scheme, rest, ok := strings.Cut(raw[:at], "://"); ok && validScheme(scheme) {
		prefix = scheme + "://"
		if name, _, ok := strings.Cut(rest, ":"); ok && plainUser(name) {
			user = name + ":"
		}
	} else if scheme, _, ok := strings.Cut(raw[:at], ":"); ok && validScheme(scheme) {
		prefix = scheme + ":"
	}
	return prefix + user + mask + raw[at:]
}

func validScheme(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return true
}

// plainUser reports whether a user name can be shown: letters, digits and
// "._-" only.
func plainUser(s string) bool {
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-", c)) {
			return false
		}
	}
	return true
}

// secretKey matches the key of a secret in a libpq key=value string or a
// query string: password=, sslpassword=, token=, … (not password_file=,
// whose value is a path).
var secretKey = regexp.MustCompile(`(?i)[a-z_]*(?:pass|secret|token)[a-z_]*\s*=\s*`)

// nextKey matches the start of the next libpq setting: a keyword libpq,
// pgx or this package knows, so that an unquoted password with a space
// and an '=' ("password=correct horse=battery") is masked whole.
var nextKey = regexp.MustCompile(`\s+(?i:host|hostaddr|port|dbname|user|passfile|password_file|channel_binding|connect_timeout|client_encoding|options|application_name|fallback_application_name|keepalives|keepalives_idle|keepalives_interval|keepalives_count|tcp_user_timeout|replication|gssencmode|sslmode|requiressl|sslcompression|sslcert|sslkey|sslcertmode|sslrootcert|sslcrl|sslcrldir|sslsni|requirepeer|ssl_min_protocol_version|ssl_max_protocol_version|krbsrvname|gsslib|gssdelegation|service|target_session_attrs|load_balance_hosts|require_auth|sslnegotiation|pool_[a-z_]+|statement_cache_capacity|description_cache_capacity|default_query_exec_mode|table|schema|migrate|ca_file|cert_file|key_file|skip_verify)\s*=`)

// conninfo matches a libpq key=value connection string.
var conninfo = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)

// secretSpans returns the [start, end) byte ranges of secret values in s.
// In a libpq string a value ends where the next key= begins (or at its
// closing quote), so a password with spaces is covered whole; in a URL it
// ends at '&'.
func secretSpans(s string) [][2]int {
	libpq := conninfo.MatchString(s)
	var spans [][2]int
	for _, m := range secretKey.FindAllStringIndex(s, -1) {
		if strings.HasSuffix(strings.ToLower(strings.TrimRight(s[m[0]:m[1]], " =")), "_file") {
			continue
		}
		start, end := m[1], len(s)
		rest := s[start:]
		switch {
		case libpq:
			end = start + libpqValueEnd(rest)
		case strings.HasPrefix(rest, "'"):
			if i := closingQuote(rest); i > 0 {
				end = start + i + 1
			}
		default:
			if i := strings.IndexAny(rest, "& \t"); i >= 0 {
				end = start + i
			}
		}
		if len(spans) > 0 && start < spans[len(spans)-1][1] {
			continue // inside the previous value
		}
		spans = append(spans, [2]int{start, end})
	}
	return spans
}

// libpqValueEnd returns where the libpq value at the start of s ends: after
// its closing quote (a quoted value), and in any case not before the next
// key= (text between a closing quote and the next key belongs to no other
// setting, so it is masked with the value).
func libpqValueEnd(s string) int {
	from := 0
	if strings.HasPrefix(s, "'") {
		if i := closingQuote(s); i > 0 {
			from = i + 1
		} else {
			return len(s)
		}
	}
	if loc := nextKey.FindStringIndex(s[from:]); loc != nil {
		return from + loc[0]
	}
	return len(s)
}

// closingQuote returns the index of the quote that closes the libpq value
// opening s, or -1.
func closingQuote(s string) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '\'':
			return i
		}
	}
	return -1
}

func maskKeyValues(s string) string {
	spans := secretSpans(s)
	for i := len(spans) - 1; i >= 0; i-- {
		s = s[:spans[i][0]] + mask + s[spans[i][1]:]
	}
	return s
}

func isSecretParam(k string) bool {
	k = strings.ToLower(k)
	if strings.HasSuffix(k, "_file") {
		return false
	}
	return strings.Contains(k, "pass") || strings.Contains(k, "secret") || strings.Contains(k, "token")
}

// secretsOf returns the password(s) in raw, as written and unescaped. It
// looks at the user information (up to the last '@', however malformed the
// URL), at secret-named query parameters and at libpq key=value secrets.
func secretsOf(raw string) []string {
	var out []string
	add := func(s string) {
		s = strings.Trim(s, "'")
		if s == "" {
			return
		}
		out = append(out, s)
		if u, err := url.PathUnescape(s); err == nil && u != s {
			out = append(out, u)
		}
		if u, err := url.QueryUnescape(s); err == nil && u != s {
			out = append(out, u)
		}
	}
	add(userInfoPassword(raw))
	if u, err := url.Parse(raw); err == nil {
		if p, ok := u.User.Password(); ok {
			add(p)
		}
		for k, vs := range u.Query() {
			if isSecretParam(k) {
				for _, v := range vs {
					add(v)
				}
			}
		}
	}
	for _, sp := range secretSpans(raw) {
		add(raw[sp[0]:sp[1]])
	}
	return out
}

// userInfoPassword returns the password in the user information of raw (up
// to the last '@', after the scheme however it is written), or "".
func userInfoPassword(raw string) string {
	at := strings.LastIndex(raw, "@")
	if at < 0 || conninfo.MatchString(raw) {
		return ""
	}
	info := raw[:at]
	if _, rest, ok := strings.Cut(info, "://"); ok {
		info = rest
	} else if _, rest, ok := strings.Cut(info, ":"); ok {
		info = strings.TrimLeft(rest, "/")
	}
	_, pass, _ := strings.Cut(info, ":")
	return pass
}

// scrub replaces in msg every whole secret (as written and unescaped) with
// "xxxxx". A parser may quote part of a malformed URL, so pieces of
// minFragment characters or more are masked as well, but never inside the
// safe strings (the URL's masked description, the list of supported URLs),
// and the whole quoted string or word that holds a piece is masked: masking
// the piece alone would show which fragments the password contains
// ("etcd://" printed as "exxxxx://").
func scrub(msg string, secrets []string, safe ...string) string {
	whole := slices.Clone(secrets)
	sort.SliceStable(whole, func(i, j int) bool { return len(whole[i]) > len(whole[j]) })
	for _, s := range whole {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, mask)
		}
	}
	pieces := fragments(secrets)
	if !containsAny(msg, pieces) {
		return msg
	}
	// Set the safe strings aside behind NUL-delimited placeholders.
	safe = append(safe, Supported)
	var kept []string
	for _, sf := range safe {
		if sf != "" && strings.Contains(msg, sf) {
			msg = strings.ReplaceAll(msg, sf, "\x00"+strconv.Itoa(len(kept))+"\x00")
			kept = append(kept, sf)
		}
	}
	msg = quoted.ReplaceAllStringFunc(msg, func(q string) string {
		if containsAny(q, pieces) {
			return q[:1] + mask + q[len(q)-1:]
		}
		return q
	})
	msg = word.ReplaceAllStringFunc(msg, func(w string) string {
		if containsAny(w, pieces) {
			return mask
		}
		return w
	})
	for i, sf := range kept {
		msg = strings.ReplaceAll(msg, "\x00"+strconv.Itoa(i)+"\x00", sf)
	}
	return msg
}

// word matches a run of characters without white space.
var word = regexp.MustCompile(`\S+`)

// quoted matches a double- or single-quoted string in a message.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'[^']*'`)

// fragments returns the pieces of minFragment characters or more of the
// secrets, longest first.
func fragments(secrets []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range secrets {
		for n := len(s); n >= minFragment; n-- {
			for i := 0; i+n <= len(s); i++ {
				if p := s[i : i+n]; !seen[p] {
					seen[p] = true
					out = append(out, p)
				}
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func containsAny(s string, pieces []string) bool {
	for _, p := range pieces {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// RedactError returns err with every password of the store URL raw, and
// every piece of one, replaced by "xxxxx". It keeps err's chain for
// errors.Is and errors.As. Use it on any error that came from code given
// raw (a client's URL parser, a dial) before it reaches output.
// A *url.Error in err quotes its URL, escaped, where a search for the
// password could miss it: the URL is replaced by its description, and a
// parse error by what parseErr says.
func RedactError(err error, raw string) error {
	raw = strings.TrimSpace(raw)
	var ue *url.Error
	if errors.As(err, &ue) {
		short := fmt.Sprintf("%s %q: %v", ue.Op, Describe(ue.URL), ue.Err)
		if ue.Op == "parse" {
			short = "parse: " + parseErr(ue, raw)
		}
		err = &redactedError{msg: strings.Replace(err.Error(), ue.Error(), short, 1), err: err}
	}
	return redact(err, secretsOf(raw), Describe(raw))
}

func redact(err error, secrets []string, safe ...string) error {
	if err == nil {
		return nil
	}
	msg := scrub(err.Error(), secrets, safe...)
	if msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, err: err}
}

// redactedError keeps the error chain for errors.Is but prints the scrubbed
// message.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// parseErr describes a url.Parse failure without repeating the URL or any
// part of its user information: a parser quotes the part it choked on, and
// with an unescaped special character in a password that part is a piece of
// the password. For a URL with user information the detail comes from
// parsing the URL again with the user information masked; when that parses,
// the fault was in the user information and no detail is given.
func parseErr(err error, raw string) string {
	if strings.Contains(raw, "@") {
		if _, err2 := url.Parse(describeRaw(raw)); err2 != nil {
			err = err2
		} else {
			return errUserInfo
		}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// errUserInfo explains a URL whose user information cannot be read.
const errUserInfo = "the user name or password is not valid in a URL: percent-encode its special characters (/ ? # @ : % and spaces), or put the password in a file named by password_file="

// parseURL parses a URL whose user information must be read exactly as
// written (redis://, postgres://); a misplaced '@', or an unescaped '#',
// '?' or '/' in a password, is an error, never a different host.
func parseURL(raw, desc string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %s", ErrBadURL, desc, parseErr(err, raw))
	}
	if _, ok := parseClean(raw); !ok {
		return nil, fmt.Errorf("%w: %q: %s", ErrBadURL, desc, errUserInfo)
	}
	return u, nil
}
