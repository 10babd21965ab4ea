package prommetrics

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrapeMarker starts each scrape of a recording, followed by the scrape's
// time in Unix milliseconds. The text format ignores such comments.
const scrapeMarker = "# leasehold-scrape "

// Scrape is one gathering of a registry at a point in time.
type Scrape struct {
	Time     time.Time
	Families []*dto.MetricFamily
}

// Record gathers g every interval until ctx ends, and once more then, and
// writes each scrape to w in the Prometheus text format with every sample
// timestamped, after a "# leasehold-scrape <unix ms>" comment line. A
// recording is a short process's metric history, e.g. a drill's: ReadRecording
// reads it back, to replay it through alert rules or backfill a Prometheus.
// Record returns the first error of gathering or writing; ctx's end is not an
// error. interval must be > 0.
func Record(ctx context.Context, g prometheus.Gatherer, w io.Writer, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("%w: record interval must be > 0, got %v", ErrInvalidOptions, interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := writeScrape(g, w, time.Now()); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return writeScrape(g, w, time.Now())
		case <-t.C:
		}
	}
}

func writeScrape(g prometheus.Gatherer, w io.Writer, now time.Time) error {
	fams, err := g.Gather()
	if err != nil {
		return fmt.Errorf("prommetrics: record: gather: %w", err)
	}
	ms := now.UnixMilli()
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "%s%d\n", scrapeMarker, ms)
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			m.TimestampMs = &ms
		}
		if _, err := expfmt.MetricFamilyToText(&buf, f); err != nil {
			return fmt.Errorf("prommetrics: record: encode %s: %w", f.GetName(), err)
		}
	}
	if _, err := w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("prommetrics: record: write: %w", err)
	}
	return nil
}

// ReadRecording reads what Record wrote, scrape by scrape.
func ReadRecording(r io.Reader) ([]Scrape, error) {
	var (
		scrapes []Scrape
		block   strings.Builder
		at      time.Time
	)
	flush := func() error {
		if at.IsZero() {
			if strings.TrimSpace(block.String()) != "" {
				return fmt.Errorf("prommetrics: recording: samples before the first %q line", strings.TrimSpace(scrapeMarker))
			}
			return nil
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		byName, err := p.TextToMetricFamilies(strings.NewReader(block.String()))
		if err != nil {
			return fmt.Errorf("prommetrics: recording: scrape at %v: %w", at, err)
		}
		s := Scrape{Time: at}
		for _, f := range byName {
			s.Families = append(s.Families, f)
		}
		scrapes = append(scrapes, s)
		block.Reset()
		return nil
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if ms, ok := strings.CutPrefix(line, scrapeMarker); ok {
			if err := flush(); err != nil {
				return nil, err
			}
			n, err := strconv.ParseInt(strings.TrimSpace(ms), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("prommetrics: recording: bad scrape line %q", line)
			}
			at = time.UnixMilli(n)
			continue
		}
		block.WriteString(line)
		block.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("prommetrics: recording: %w", err)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return scrapes, nil
}
