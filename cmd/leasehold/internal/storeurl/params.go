package storeurl

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// EnvPasswordFile names the environment variable with the path of a file
// holding the store password, used when the URL has neither a password nor
// a password_file parameter.
const EnvPasswordFile = "LEASEHOLD_STORE_PASSWORD_FILE"

// Parameters this package takes out of every URL before the store's own
// parser sees it.
const (
	paramPasswordFile = "password_file"
	paramCAFile       = "ca_file"
	paramCertFile     = "cert_file"
	paramKeyFile      = "key_file"
	paramSkipVerify   = "skip_verify"
)

// common holds the parameters that work the same for every scheme.
type common struct {
	passwordFile string
	caFile       string
	certFile     string
	keyFile      string
	skipVerify   bool
}

func (c common) wantsTLS() bool {
	return c.caFile != "" || c.certFile != "" || c.keyFile != "" || c.skipVerify
}

// splitQuery returns the query of raw (after the first '?' behind the user
// information) and raw without it.
func splitQuery(raw string) (base, query string, has bool) {
	from := strings.LastIndex(raw, "@") + 1
	i := strings.Index(raw[from:], "?")
	if i < 0 {
		return raw, "", false
	}
	return raw[:from+i], raw[from+i+1:], true
}

// takeCommon removes this package's parameters from raw's query and returns
// them, with raw rebuilt. Other parameters are kept as written.
func takeCommon(raw, desc string) (string, common, error) {
	var c common
	base, query, has := splitQuery(raw)
	if !has {
		return raw, c, nil
	}
	var kept []string
	for _, kv := range strings.Split(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		name, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(v)
		if err1 != nil || err2 != nil {
			kept = append(kept, kv) // the store's parser reports it
			continue
		}
		if err := c.set(name, val); errors.Is(err, errNotOurs) {
			kept = append(kept, kv)
		} else if err != nil {
			return "", c, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
		}
	}
	if len(kept) == 0 {
		return base, c, nil
	}
	return base + "?" + strings.Join(kept, "&"), c, nil
}

var errNotOurs = errors.New("not a common parameter")

func (c *common) set(name, val string) error {
	dst := map[string]*string{
		paramPasswordFile: &c.passwordFile, paramCAFile: &c.caFile,
		paramCertFile: &c.certFile, paramKeyFile: &c.keyFile,
	}[name]
	switch {
	case dst != nil && val == "":
		return fmt.Errorf("%s= is empty", name)
	case dst != nil:
		*dst = val
	case name == paramSkipVerify:
		b, err := strconv.ParseBool(val)
		if err != nil {
			return fmt.Errorf("%s=%q: want true or false", name, val)
		}
		c.skipVerify = b
	default:
		return errNotOurs
	}
	return nil
}

// withPassword puts the password read from file into raw's user
// information. raw must not carry a password already.
func withPassword(raw, desc, file string) (string, string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", "", fmt.Errorf("%w: %q: password file: %v", ErrBadURL, desc, err)
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", "", fmt.Errorf("%w: %q: password file %s is empty", ErrBadURL, desc, file)
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return "", "", fmt.Errorf("%w: %q: a password file needs a URL with a host", ErrBadURL, desc)
	}
	user := ""
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		user, rest = rest[:at], rest[at+1:]
		if strings.Contains(user, ":") {
			return "", "", fmt.Errorf("%w: %q: the URL has a password and a password file; keep one", ErrBadURL, desc)
		}
	}
	enc := strings.TrimPrefix(url.UserPassword("", pw).String(), ":")
	return scheme + "://" + user + ":" + enc + "@" + rest, pw, nil
}

// hasPassword reports whether raw's user information has a password.
func hasPassword(raw string) bool {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return false
	}
	at := strings.LastIndex(rest, "@")
	return at >= 0 && strings.Contains(rest[:at], ":")
}

// tlsConfig builds the client TLS configuration of c for a server named
// host: the CA file replaces the system roots, a certificate and key pair is
// presented for mutual TLS, and host names are checked unless skip_verify.
func (c common) tlsConfig(host string) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.skipVerify} //nolint:gosec // skip_verify is the user's choice, warned about
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s: no PEM certificate in it", c.caFile)
		}
		cfg.RootCAs = pool
	}
	if (c.certFile == "") != (c.keyFile == "") {
		return nil, errors.New("cert_file and key_file go together (the client certificate and its key)")
	}
	if c.certFile != "" {
		pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
		if err != nil {
			return nil, fmt.Errorf("cert_file/key_file: %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// skipVerifyWarning is the warning for skip_verify=true.
const skipVerifyWarning = "skip_verify=true: the store's TLS certificate is not checked, so anyone on the network path can pose as the store and read the password; use ca_file= instead"

func (c common) warnings() []string {
	if c.skipVerify {
		return []string{skipVerifyWarning}
	}
	return nil
}

// prefixRE is what a prefix= parameter may hold: key-name characters only,
// so no prefix can reach into another application's keys by a pattern or
// control character.
var prefixRE = regexp.MustCompile(`^[A-Za-z0-9_.:/{}-]{1,128}$`)

// checkPrefix validates a prefix= parameter ("" is the default).
func checkPrefix(prefix, desc string) error {
	if prefix != "" && !prefixRE.MatchString(prefix) {
		return fmt.Errorf("%w: %q: prefix=%q must match %s", ErrBadURL, desc, prefix, prefixRE)
	}
	return nil
}
