package stores

import (
	"net/url"
	"strings"
)

// The forms a target takes.
type form int

const (
	formFile         form = iota
	formURL               // postgres:// or postgresql://, the scheme in any case
	formKeywordValue      // libpq's keyword/value string: host=db dbname=agents …
)

// mask replaces a password; withheld replaces the rest of a string that
// stops making sense, since a password may hide in it.
const (
	mask     = "xxxxx"
	withheld = "…"
)

// formOf tells what target names. A keyword/value string is recognised by
// its start (a keyword, then '='), not by parsing it whole: a malformed one
// is still a connection string, for pgx to say what is wrong with, and
// never a file name to create or to echo.
func formOf(target string) form {
	lower := strings.ToLower(target)
	if strings.HasPrefix(lower, "postgres://") || strings.HasPrefix(lower, "postgresql://") {
		return formURL
	}
	s := strings.TrimLeft(target, spaces)
	i := 0
	for i < len(s) && (s[i] == '_' || 'a' <= s[i] && s[i] <= 'z' || 'A' <= s[i] && s[i] <= 'Z' || i > 0 && '0' <= s[i] && s[i] <= '9') {
		i++
	}
	if i > 0 && strings.HasPrefix(strings.TrimLeft(s[i:], spaces), "=") {
		return formKeywordValue
	}
	return formFile
}

// spaces are the characters libpq skips between keyword/value pairs.
const spaces = " \t\n\r\v\f"

// isPasswordKey reports whether a connection parameter's name (a URL's
// still percent-encoded) names a password. Case is ignored: a key libpq
// would not take is still no place to show a secret.
func isPasswordKey(key string) bool {
	if k, err := url.PathUnescape(key); err == nil {
		key = k
	}
	key = strings.ToLower(key)
	return key == "password" || key == "sslpassword"
}

// pgURL is a postgres:// URL taken apart as far as masking needs.
type pgURL struct {
	scheme string // "postgres" or "postgresql", in lower case
	rest   string // what follows "://"
	// userEnd is the index in rest of the '@' that ends the user part, or
	// -1. It is where pgx ends it (pgxEnd) unless the password holds an
	// unencoded '@' or '/', which pgx would misread: then it is the last
	// '@' that could end the user part, so the whole password is masked.
	userEnd int
	pgxEnd  int // pgx's (and libpq's) reading: the first '@' before any '/', or -1
}

func parseURL(target string) pgURL {
	scheme, rest, _ := strings.Cut(target, "://")
	u := pgURL{scheme: strings.ToLower(scheme), rest: rest, userEnd: -1, pgxEnd: -1}
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		u.pgxEnd, u.userEnd = i, i
		host := rest[i+1:]
		if j := strings.IndexByte(host, '/'); j >= 0 {
			host = host[:j]
		}
		if k := strings.LastIndexByte(host, '@'); k >= 0 {
			u.userEnd = i + 1 + k
		}
	} else if k := strings.LastIndexByte(rest, '@'); k >= 0 && strings.IndexByte(rest[:k], ':') >= 0 {
		u.userEnd = k
	}
	return u
}

// user is the user part split at its first ':' (pgx's reading); plain is
// false when the name holds what no user name written in a URL holds, a
// sign that the part is not a user name at all.
func (u pgURL) user() (name, password string, plain bool) {
	if u.userEnd < 0 {
		return "", "", false
	}
	name, password, _ = strings.Cut(u.rest[:u.userEnd], ":")
	return name, password, !strings.ContainsAny(name, "/?#&=@")
}

// problem says why pgx would misread the URL or quote part of a password
// in its error, or "": a password holding an unencoded '@' or '/' (pgx
// would read part of it as the host), or a query parameter without '='
// (a password holding an unencoded '&').
func (u pgURL) problem() string {
	if _, _, plain := u.user(); u.userEnd != u.pgxEnd && plain {
		return "the password holds an unencoded '@' or '/', which would be read as part of the host: percent-encode them (%40, %2F)"
	}
	if _, ok := maskQuery(u.rest[u.userEnd+1:]); !ok {
		return "a query parameter has no '=' (a password holding an unencoded '&'? percent-encode it, %26)"
	}
	return ""
}

// String is the URL with its scheme in lower case, as pgx takes it.
func (u pgURL) String() string { return u.scheme + "://" + u.rest }

// masked is the URL with every password masked.
func (u pgURL) masked() string {
	if u.userEnd < 0 {
		q, _ := maskQuery(u.rest)
		return u.scheme + "://" + q
	}
	var b strings.Builder
	b.WriteString(u.scheme + "://")
	name, password, plain := u.user()
	switch {
	case !plain:
		b.WriteString(mask)
	case password != "":
		b.WriteString(name + ":" + mask)
	default:
		b.WriteString(u.rest[:u.userEnd])
	}
	q, _ := maskQuery(u.rest[u.userEnd+1:])
	b.WriteString("@" + q)
	return b.String()
}

// maskQuery masks the values of the password parameters in s's query. A
// parameter without '=' may be the rest of a password holding an unencoded
// '&': it and what follows are withheld, and ok is false.
func maskQuery(s string) (masked string, ok bool) {
	q := strings.IndexByte(s, '?')
	if q < 0 {
		return s, true
	}
	pairs := strings.Split(s[q+1:], "&")
	for i, p := range pairs {
		k, v, found := strings.Cut(p, "=")
		switch {
		case !found:
			return s[:q+1] + strings.Join(append(pairs[:i:i], withheld), "&"), false
		case v != "" && isPasswordKey(k):
			pairs[i] = k + "=" + mask
		}
	}
	return s[:q+1] + strings.Join(pairs, "&"), true
}

// maskKeywordValue masks the password values of a keyword/value string,
// keeping the rest as written. It reads the string as libpq does (values
// unquoted up to a space, or single-quoted; a backslash escapes the next
// character); from where it stops making sense the rest is withheld, and
// problem says why.
func maskKeywordValue(s string) (masked, problem string) {
	var b strings.Builder
	i := 0
	for {
		j := i
		for j < len(s) && strings.IndexByte(spaces, s[j]) >= 0 {
			j++
		}
		b.WriteString(s[i:j])
		if i = j; i == len(s) {
			return b.String(), ""
		}
		eq := strings.IndexByte(s[i:], '=')
		if key := strings.Trim(s[i:i+max(eq, 0)], spaces); eq < 0 || key == "" || strings.ContainsAny(key, spaces) {
			b.WriteString(withheld)
			return b.String(), "a word without '=' (a value holding spaces must be quoted: password='a b')"
		}
		secret := isPasswordKey(strings.Trim(s[i:i+eq], spaces))
		start := i + eq + 1
		for start < len(s) && strings.IndexByte(spaces, s[start]) >= 0 {
			start++
		}
		b.WriteString(s[i:start])
		end, ok := valueEnd(s, start)
		switch {
		case !ok && secret:
			b.WriteString(mask)
			return b.String(), "a quoted value has no closing quote"
		case !ok:
			b.WriteString(withheld)
			return b.String(), "a quoted value has no closing quote"
		case secret && end > start:
			b.WriteString(mask)
		default:
			b.WriteString(s[start:end])
		}
		i = end
	}
}

// valueEnd is the end of the keyword/value value starting at i, or false
// for a quoted value without its closing quote.
func valueEnd(s string, i int) (int, bool) {
	if i < len(s) && s[i] == '\'' {
		for j := i + 1; j < len(s); j++ {
			switch s[j] {
			case '\\':
				j++
			case '\'':
				return j + 1, true
			}
		}
		return len(s), false
	}
	j := i
	for ; j < len(s) && strings.IndexByte(spaces, s[j]) < 0; j++ {
		if s[j] == '\\' {
			j++
		}
	}
	return min(j, len(s)), true
}
