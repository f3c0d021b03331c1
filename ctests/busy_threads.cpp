// busy_threads.c with std::thread, new and delete, and a std::map.
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

static std::atomic<bool> stop{false};

static unsigned long work(int id) {
    unsigned long n = 0;
    std::vector<std::unique_ptr<std::string>> slots(64);
    std::map<int, std::string> m;
    while (!stop.load(std::memory_order_relaxed)) {
        slots[n % 64] = std::make_unique<std::string>(40 + (n * 7 + id) % 300, 'x');
        m[n % 100] = std::to_string(n);
        n++;
    }
    return n;
}

int main(int argc, char **argv) {
    unsigned long r[2] = {0, 0};
    std::thread a([&] { r[0] = work(0); }), b([&] { r[1] = work(1); });
    if (argc > 1) {
        std::this_thread::sleep_for(std::chrono::seconds(std::atoi(argv[1])));
    } else {
        char buf[64];
        while (read(0, buf, sizeof buf) > 0) {
        }
    }
    stop = true;
    a.join();
    b.join();
    std::printf("done %s\n", r[0] + r[1] > 0 ? "ok" : "none");
    return 0;
}
