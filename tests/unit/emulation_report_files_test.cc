// The run's files as the report library reads them (emulation/report_files.h) and the chart
// of a CSV of series (emulation/csv_plot.h), on small files made in a temporary directory.
#include "emulation/report_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "emulation/csv_plot.h"
#include "tests/support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using namespace edgetrain::emulation;
using edgetrain::testing::TempDir;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
  return n;
}

TEST(ReportFiles, AMissingCsvIsAnEmptyTable) {
  TempDir dir("edgetrain-report-files");
  const CsvTable table = read_csv(dir.path() / "links.csv");
  EXPECT_TRUE(table.header.empty());
  EXPECT_TRUE(table.rows.empty());
}

TEST(ReportFiles, ReadsColumnsByNameAndSkipsBlankLines) {
  TempDir dir("edgetrain-report-files");
  write(dir.path() / "t.csv", "worker,delay_ms,loss\n0,5,0.01\n\n1,12.5,0\n");
  const CsvTable table = read_csv(dir.path() / "t.csv");
  ASSERT_EQ(table.rows.size(), 2u);  // the blank line is no row
  EXPECT_EQ(table.column("loss"), 2u);
  EXPECT_DOUBLE_EQ(table.number(1, "delay_ms"), 12.5);
  EXPECT_EQ(table.rows[0].at(table.column("worker")), "0");
  EXPECT_THROW(table.column("jitter_ms"), std::invalid_argument);
  EXPECT_THROW(table.number(2, "loss"), std::out_of_range);
}

TEST(ReportFiles, SplitFieldsKeepsEmptyFieldsInside) {
  EXPECT_EQ(split_fields("12,,0.9"), (std::vector<std::string>{"12", "", "0.9"}));
  EXPECT_TRUE(split_fields("").empty());
}

// logs/worker-I.K.stats.json, K the incarnation: numeric order (10 after 2), this worker's only.
TEST(ReportFiles, WorkerStatsFilesComeInIncarnationOrder) {
  TempDir dir("edgetrain-report-files");
  const fs::path logs = dir.path() / "logs";
  for (const char* name :
       {"worker-1.2.stats.json", "worker-1.10.stats.json", "worker-1.0.stats.json",
        "worker-1.1.stats.json", "worker-11.0.stats.json", "worker-1.3.stats.json.tmp",
        "worker-1.x.stats.json", "shard-1-0.stats.json"})
    write(logs / name, "{}");
  const std::vector<fs::path> expected = {
      logs / "worker-1.0.stats.json", logs / "worker-1.1.stats.json",
      logs / "worker-1.2.stats.json", logs / "worker-1.10.stats.json"};
  EXPECT_EQ(worker_stats_files(dir.path(), 1), expected);
  EXPECT_EQ(worker_stats_files(dir.path(), 11),
            std::vector<fs::path>{logs / "worker-11.0.stats.json"});
  EXPECT_TRUE(worker_stats_files(dir.path(), 2).empty());
  EXPECT_TRUE(worker_stats_files(dir.path() / "no-such-run", 1).empty());
}

TEST(ReportFiles, ReadJsonRefusesMissingAndBrokenFiles) {
  TempDir dir("edgetrain-report-files");
  write(dir.path() / "good.json", R"({"steps": 3, "acknowledged_versions": [1, 2]})");
  write(dir.path() / "torn.json", R"({"steps": 3, "ackno)");
  EXPECT_EQ(read_json(dir.path() / "good.json").at("steps").get<int>(), 3);
  EXPECT_THROW(read_json(dir.path() / "absent.json"), std::invalid_argument);
  EXPECT_THROW(read_json(dir.path() / "torn.json"), nlohmann::json::exception);
}

TEST(ReportFiles, WriteFileReplacesTheWholeFileAndLeavesNoTemporary) {
  TempDir dir("edgetrain-report-files");
  fs::create_directories(dir.path());
  const fs::path path = dir.path() / "timeline.csv";
  write_file(path, "a long first version\nwith two lines\n");
  write_file(path, "short\n");
  EXPECT_EQ(read_text(path), "short\n");
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
  EXPECT_EQ(read_text(dir.path() / "absent"), "");
}

TEST(ReportFiles, NumbersAsText) {
  EXPECT_EQ(bytes_text(12345), "12.3 kB");
  EXPECT_EQ(bytes_text(999999), "1000.0 kB");  // below 1e6 stays in kB
  EXPECT_EQ(bytes_text(1e6), "1.00 MB");
  EXPECT_EQ(bytes_text(2.5e9), "2.50 GB");
  EXPECT_EQ(fixed(3.14159, 2), "3.14");
  EXPECT_EQ(fixed(2.0 / 3.0, 3), "0.667");
  EXPECT_EQ(fixed(7, 0), "7");
}

// Rows of one series join into one line wherever they are in the file; columns by name.
TEST(CsvPlot, OneLinePerSeriesInOrderOfFirstAppearance) {
  TempDir dir("edgetrain-csv-plot");
  write(dir.path() / "curves.csv", "x,note,series,y\n1,-,b,0.5\n2,-,a,0.6\n3,-,b,0.7\n");
  edgetrain::plot::PlotOptions options;
  options.title = "two curves";
  plot_csv((dir.path() / "curves.csv").string(), (dir.path() / "c.svg").string(), options);
  const std::string svg = read_text(dir.path() / "c.svg");
  EXPECT_EQ(count(svg, "<polyline"), 2u);
  const auto b = svg.find(">b</text>"), a = svg.find(">a</text>");
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(a, std::string::npos);
  EXPECT_LT(b, a);  // b came first in the file
  // b's line has its two points (rows 1 and 3), a's one.
  const auto first = svg.find("points=\""), second = svg.find("points=\"", first + 1);
  const std::string b_points = svg.substr(first, svg.find('"', first + 8) - first);
  const std::string a_points = svg.substr(second, svg.find('"', second + 8) - second);
  EXPECT_EQ(count(b_points, ","), 2u);
  EXPECT_EQ(count(a_points, ","), 1u);
  EXPECT_NE(svg.find("two curves"), std::string::npos);
}

TEST(CsvPlot, RefusesWhatItCannotDraw) {
  TempDir dir("edgetrain-csv-plot");
  const std::string csv = (dir.path() / "c.csv").string(), svg = (dir.path() / "c.svg").string();
  edgetrain::plot::PlotOptions options;
  EXPECT_THROW(plot_csv(csv, svg, options), std::invalid_argument);  // no file
  write(csv, "series,x,y\na,1,0.5\na,2\n");
  try {
    plot_csv(csv, svg, options);
    ADD_FAILURE() << "a short row was drawn";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  write(csv, "series,x,value\na,1,0.5\n");
  EXPECT_THROW(plot_csv(csv, svg, options), std::invalid_argument);  // no y column
  write(csv, "series,x,y\na,1,5\n");
  options.y_min = 10, options.y_max = 1;
  EXPECT_THROW(plot_csv(csv, svg, options), std::invalid_argument);
  options.y_min = 1, options.y_max = 10;
  EXPECT_THROW(plot_csv(csv, (dir.path() / "no-dir" / "c.svg").string(), options),
               std::runtime_error);
  plot_csv(csv, svg, options);
  EXPECT_TRUE(fs::exists(svg));
}

}  // namespace
