// config: the built-in topic vocabulary's terms (see semantic_topics.hpp).
//
// Written from general knowledge of each field, not from any evaluation
// set. Terms are separated by ',' or newlines, normalised as prompts are
// (case does not matter; punctuation splits tokens as it does in a prompt:
// "Node.js" is "node . js"). Left out of code, math and translation on
// purpose: words as often something else in a chat ("rust", "swift",
// "ruby", "go", "eclipse", "poetry", "cargo", "yarn", "react", "script",
// "framework", "library",
// "mean", "times", "方法", "继承", "崩溃", "仓库", "日志"; "python" and
// "java" are kept; "sin", "cos", "tan", "pi", 积分 (points), 证明 (a
// certificate), 分数 (a score), 指数 (an index), 平方 (in 平方米), 比例,
// 公式; "how do I say", "word for word", "bilingual", "subtitles"), a
// language named alone, in English or Chinese (英语, 日文), and single
// Chinese characters (a character is a token: "库" is in 仓库, 金库). A word
// can be kept in a phrase that is unambiguous ("react native", "python
// script", 定积分, 证明题). What chat's list leaves out is said above it.
#include "sluice/config/semantic_topics.hpp"

#include <string>

namespace sluice::config {

namespace {

// Programming: languages, libraries, frameworks, tools, CLIs, package
// managers, errors and exceptions, DevOps, cloud and databases.
constexpr std::string_view k_code = R"(
python, python2, python3, cpython, pypy, javascript, ecmascript, typescript, java, jvm, jdk, jre, kotlin, scala,
golang, rustlang, rustc, c++, cpp, c++11, c++14, c++17, c++20, c#, csharp, f#, objective-c, objc, php, perl, lua,
haskell, erlang, elixir, clojure, ocaml, fortran, cobol, matlab, octave, vb.net, vba, visual basic, powershell,
bash, zsh, fish shell, shell script, shell scripting, bash script, sql, plsql, pl/sql, t-sql, tsql, nosql, html,
html5, css, css3, scss, less css, json, jsonl, yaml, yml, xml, toml, protobuf, graphql, regex, regexp,
regular expression, wasm, webassembly, cuda, opencl, glsl, hlsl, verilog, vhdl, solidity, assembly language,
x86 assembly, nasm, masm, llvm ir, bytecode, jsx, tsx, groovy script, dart language, zig, nim, crystal lang,
reactjs, react.js, react native, redux, vue, vuejs, vue.js, vuex, pinia, nuxt, nuxtjs, angularjs,
svelte, sveltekit, solidjs, next.js, nextjs, gatsby, remix run, jquery, bootstrap css, tailwind, tailwindcss,
nodejs, node.js, deno, bun runtime, express.js, expressjs, nestjs, koa, fastify, django, flask, fastapi,
starlette, uvicorn, gunicorn, celery, sqlalchemy, alembic, pydantic, ruby on rails, rails app, sinatra, laravel,
symfony, codeigniter, wordpress plugin, spring boot, springboot, spring framework, spring mvc, hibernate, jpa,
mybatis, maven, gradle, ant build, .net, dotnet, .net core, asp.net, blazor, entity framework, linq, xamarin,
maui, wpf, winforms, qt, pyqt, pyside, tkinter, gtk, wxwidgets, tauri, flutter, swiftui, uikit,
jetpack compose, android studio, xcode, cocoapods, gradle build, numpy, pandas, dataframe, scipy, sympy,
matplotlib, seaborn, plotly, sklearn, scikit-learn, tensorflow, pytorch, keras, huggingface, hugging face,
langchain, llamaindex, opencv, beautifulsoup, bs4, scrapy, selenium webdriver, puppeteer, pytest, unittest,
junit, testng, mockito, vitest, cypress test, jasmine test, rspec, gtest, googletest, catch2,
doctest, boost library, stl container, std::vector, std::string, std::map, std::move, unique_ptr, shared_ptr,
webpack, vite, esbuild, parcel bundler, babel config, eslint, tslint, prettier config, npm, npx, pnpm,
yarn install, yarn add, node_modules, package.json, package-lock.json, tsconfig, tsconfig.json, requirements.txt,
pyproject.toml, setup.py, pip, pip3, pipenv, pipx, conda, miniconda, virtualenv, venv, virtual environment,
pyenv, nvm, rbenv, rubygems, gemfile, bundler gem, composer.json, cargo.toml, cargo build, cargo run, crates.io,
cmake, cmakelists, cmakelists.txt, makefile, make install, autotools, bazel, meson build, ninja build, gcc, g++,
clang, clang++, llvm, msvc, mingw, gdb, lldb, valgrind, asan, addresssanitizer, strace, ltrace, perf record,
linker, compiler, compile, compiled, compiling, compilation, transpile, transpiler, interpreter, debugger,
debug, debugging, breakpoint, breakpoints, ide, vscode, vs code, visual studio, intellij, pycharm, webstorm,
clion, goland, rider ide, vim, neovim, nvim, emacs, sublime text, jupyter, jupyter notebook, ipython, colab,
git, github, gitlab, bitbucket, git commit, git push, git pull, git merge, git rebase, git clone, git stash,
pull request, merge request, merge conflict, rebase, cherry-pick, gitignore, .gitignore, repo, codebase,
docker, dockerfile, docker-compose, docker compose, container image, kubernetes, k8s, kubectl, minikube, helm chart,
terraform, ansible, puppet manifest, chef cookbook, vagrant, nginx, apache httpd, haproxy, traefik, caddy server,
jenkins pipeline, jenkinsfile, github actions, gitlab ci, circleci, travis ci, ci/cd, cicd, ci pipeline, devops,
aws, amazon web services, ec2, s3 bucket, aws lambda, lambda function, cloudformation, dynamodb, rds, iam role,
gcp, google cloud, gke, bigquery, azure devops, azure functions, heroku, vercel, netlify, cloudflare workers,
firebase, firestore, supabase, serverless, linux, ubuntu, debian, centos, rhel, alpine linux, arch linux, unix,
wsl, wsl2, systemd, systemctl, journalctl, cron, crontab, cronjob, sudo, chmod, chown, ssh, sshd, scp, rsync,
wget, grep, xargs, tmux, bashrc, .bashrc, zshrc, environment variable, environment variables,
env var, path variable, command line, command-line, cli, terminal command, shell command, stdin, stdout, stderr,
localhost, 127.0.0.1, port 8080, api, apis, rest api, restful, api endpoint, endpoint, endpoints, http request,
http response, status code, websocket, websockets, grpc, oauth, oauth2, jwt, cors, csrf, xss, sql injection,
tcp, udp, tcp/ip, dns record, ssl certificate, tls certificate, https, load balancer,
reverse proxy, microservice, microservices, backend, back-end, frontend, front-end, full stack, fullstack, orm,
crud, mvc, mvvm, sdk, sdks, middleware, webhook, webhooks, runtime, dependency injection, dependencies,
mysql, mariadb, postgres, postgresql, psql, sqlite, sqlite3, mongodb, mongoose, redis, memcached, cassandra,
elasticsearch, kafka, rabbitmq, zookeeper, etcd, clickhouse, snowflake sql, oracle database, sql server, mssql,
database, databases, db schema, database schema, primary key, foreign key, sql query, select query, join query,
stored procedure, database index, transaction isolation, migration script, schema migration,
unit test, unit tests, unit testing, integration test, test case, test cases, tdd, mock object, code coverage,
refactor, refactoring, code review, source code, snippet, code snippet, boilerplate, pseudocode, linter,
function call, function signature, return value, return type, variable, variables, global variable,
argument list, args, kwargs, argv, argc, int, integer overflow, boolean, bool, float32,
float64, double precision, char array, string literal, f-string, struct, structs, enum, enums, typedef, union type,
nullptr, null pointer, null reference, dangling pointer, reference counting, garbage collector,
garbage collection, malloc, calloc, realloc, free(), memory allocation, stack overflow, heap allocation,
async, await, async/await, coroutine, coroutines, goroutine, goroutines, promise chain,
event loop, thread pool, multithreading, multithreaded, multiprocessing, concurrency, parallelism,
mutex, mutexes, semaphore, spinlock, deadlock, race condition, data race, atomic operation, lock-free,
class method, static method, instance variable, constructor, destructor, inheritance hierarchy, polymorphism,
encapsulation, abstract class, template metaprogramming, lambda expression, closure scope,
decorator function, iterator, iterators, generator function, list comprehension, hashmap, hash map, hashtable,
hash table, hashset, linked list, doubly linked list, binary tree, binary search tree, bst, avl tree,
red-black tree, trie, heap sort, quicksort, merge sort, bubble sort, insertion sort, binary search, dfs, bfs,
depth-first search, breadth-first search, dynamic programming, memoization, big o, big-o, time complexity,
space complexity, algorithm, algorithms, data structure, data structures, leetcode, hackerrank, codeforces,
array, arrays, 2d array, vector<int>, substring, string manipulation, parse, parser, parsing, tokenizer,
serialize, serialization, deserialize, utf-8, utf8, ascii code, unicode, base64, bitwise, bit shift, bitmask,
hex dump, byte array, buffer overflow, off-by-one, integer division, floating point error,
bug, bugs, buggy, bugfix, hotfix, compile error, compiler error, compilation error, build error, build failed,
runtime error, syntax error, type error, throw exception, try/catch, try catch,
stack trace, stacktrace, traceback, segfault, segmentation fault, core dump, core dumped, memory leak,
sigsegv, sigabrt, sigkill, sigterm, oom, oomkilled, out of memory error, exit code, errno, enoent, eacces,
econnrefused, econnreset, eaddrinuse, etimedout, 404 error, 500 error, 502 bad gateway, 503 service unavailable,
typeerror, valueerror, keyerror, indexerror, attributeerror, importerror, modulenotfounderror, syntaxerror,
indentationerror, nameerror, zerodivisionerror, filenotfounderror, permissionerror, oserror, runtimeerror,
recursionerror, unicodedecodeerror, assertionerror, stopiteration, referenceerror, rangeerror,
nullpointerexception, npe, classnotfoundexception, illegalargumentexception, illegalstateexception,
arrayindexoutofboundsexception, indexoutofboundsexception, concurrentmodificationexception,
numberformatexception, classcastexception, outofmemoryerror, stackoverflowerror, ioexception,
filenotfoundexception, sqlexception, nosuchelementexception, unsupportedoperationexception,
invalidoperationexception, nullreferenceexception, argumentnullexception, panic: runtime error,
borrow checker, lifetime error, undefined reference, undefined behavior, unresolved external symbol,
linker error, cannot find module, module not found, command not found, permission denied, no such file or directory,
is not a function, is not defined, undefined is not, cannot read property, cannot read properties,
deprecated, deprecation warning, warning: unused, type mismatch, type annotation, type hint, type hints,
console.log, printf, println, print(), system.out.println, cout, std::cout, cin, scanf, fmt.println,
def, elif, self., __init__, __main__, init(), main(), public static void, void, const, var,
import numpy, import pandas, #include, namespace,
api key, access token, rate limit error, http 429, json parse, json.parse, json.dumps, jsonify, xpath,
css selector, virtual dom, innerhtml, queryselector, addeventlistener, onclick, useeffect, usestate,
render loop, hydration, ssr, pwa, responsive layout, flexbox, css grid,
http server, web server, web scraping, web scraper, crawler, scraper, chrome extension, browser extension,
ios app, android app, mobile app, apk, app store connect, gradle sync, build.gradle, manifest.xml,
machine learning model, neural network training, training loop, gradient descent code, batch size,
overfitting, hyperparameter, hyperparameters, fine-tuning, inference server, onnx, tensorrt, vllm,
cuda out of memory, gpu memory, llm api, openai api, prompt template, embedding model, vector database,
raspberry pi, arduino, esp32, microcontroller, firmware, embedded c, rtos, gpio, i2c, spi bus, uart,
regex pattern, cron expression, sql join, inner join, left join, group by, order by, where clause,
excel macro, vba macro, google apps script, power query, dax formula,
apps script, office scripts, power automate, spreadsheet formula, spreadsheet formulas, excel formula,
excel formulas, sheets formula, google sheets formula, array formula, arrayformula, importrange, vlookup,
hlookup, xlookup, index match, countif, countifs, sumif, sumifs, averageif, averageifs, iferror, sumproduct,
textjoin, conditional formatting, data validation, pivot table, pivot tables, named range, cell reference,
absolute reference, #n/a, #value!, #ref!, #div/0!, #name?, csv export, csv import, csv file, webhook, webhooks,
shopify liquid, liquid template, woocommerce plugin, wordpress theme, booking plugin, custom css,
blank screen, blank page, white screen, embed code,
单元格, 单元格引用, 表格公式, excel公式, 公式报错, 下拉公式, 条件格式, 数据透视表, 透视表, 数据有效性, 录制宏, 宏代码,
excel宏, wps表格, 谷歌表格, 多维表格, wps, google sheets, spreadsheet, spreadsheets, in excel, excel 里, excel 中,
excel 怎么, excel 表, excel sheet, excel sheets, excel file, excel files, excel workbook, excel column, excel columns,
excel rows, excel thing, 拆成两列, 分成两列, 合并成一列, 合并到一列, 群机器人, 微信机器人, 钉钉机器人, 自动回复机器人, 批量重命名, 白屏,
programming, programmer, programmers, python script, exception handling, callback function, react component,
react hook, react hooks, react app, node server, npm start, 计算机, 计算机程序, coding, coder, code, codes, coded, scripting,
software engineering, software development, developer, developers, dev environment, localhost:3000, build system,
version control, open source project, release build, debug build, binary file, executable, executables,
library function, standard library, third-party library, npm package, pip package, python package,
pypi, npm registry, maven central, nuget, brew install, apt-get, apt install, yum install, dnf install,
代码, 源代码, 源码, 编程, 程序员, 写程序, 程序代码, 小程序, 脚本, 编译, 编译器, 编译错误, 编译失败, 解释器, 运行时, 调试, 断点,
报错, 错误信息, 异常, 抛出异常, 捕获异常, 空指针, 段错误, 内存泄漏, 内存泄露, 内存溢出, 栈溢出, 死循环, 死锁, 竞态条件, 闪退,
函数, 函数调用, 回调函数, 匿名函数, 构造函数, 析构函数, 返回值, 变量, 全局变量, 局部变量, 常量, 参数传递, 形参, 实参,
数据类型, 整型, 浮点型, 浮点数, 布尔值, 字符串, 数组, 列表推导, 哈希表, 哈希, 链表, 二叉树, 红黑树, 栈和队列, 队列, 堆栈, 指针,
引用计数, 垃圾回收, 面向对象, 类和对象, 多态, 封装, 接口, 抽象类, 泛型, 迭代器, 生成器, 装饰器, 闭包, 递归函数,
多线程, 线程, 线程池, 协程, 异步, 同步锁, 互斥锁, 并发, 高并发, 数据结构, 算法题, 时间复杂度, 空间复杂度, 动态规划,
排序算法, 冒泡排序, 快速排序, 归并排序, 二分查找, 深度优先, 广度优先, 力扣,
数据库, 数据表, 主键, 外键, 索引优化, 存储过程, 慢查询, 分库分表, 缓存穿透, 缓存击穿, 消息队列, 中间件,
前端, 后端, 全栈, 服务端, 客户端, 服务器, 云服务器, 部署, 上线, 容器, 容器化, 镜像, 集群, 微服务, 负载均衡, 反向代理, 运维,
接口文档, 接口调用, 请求头, 跨域, 端口, 端口号, 防火墙, 域名解析, 环境变量, 虚拟环境, 配置文件, 依赖包, 安装包, 包管理,
命令行, 终端命令, 脚本语言, 正则, 正则表达式, 爬虫, 网页开发, 网站开发, 插件开发, 版本控制, 代码仓库, 分支合并, 代码审查,
单元测试, 测试用例, 自动化测试, 重构, 开发框架, 前端框架, 组件, 渲染, 样式表, 页面布局, 开发环境, 编辑器, 注释, 缩进,
编译通过, 运行报错, 源文件, 头文件, 库函数, 第三方库, 标准库, 模块, 导入模块, 序列化, 反序列化, 乱码, 编码格式,
位运算, 内核, 驱动程序, 操作系统, 虚拟机, 嵌入式, 单片机, 固件, 日志文件, 堆内存, 内存分配, 程序, 软件开发, 开发者,
)";

// Mathematics: its objects, operations and fields.
constexpr std::string_view k_math = R"(
math, maths, mathematics, variable, variables, 变量, 自变量, 因变量, mathematical, mathematically, arithmetic, algebra, algebraic, geometry, geometric,
trigonometry, trigonometric, calculus, precalculus, statistics problem, probability, probabilities, combinatorics,
number theory, linear algebra, differential equation, differential equations, ode, pde, topology, set theory,
equation, equations, inequality, inequalities, system of equations, linear equation, quadratic, quadratic equation,
quadratic formula, cubic equation, polynomial, polynomials, monomial, binomial, binomial theorem, coefficient,
coefficients, variable x, solve for x, solve for y, unknown x,
factorise, factorize, factorization, factorisation, factoring, root of, roots of, square root, cube root,
sqrt, radical, exponent, exponents, exponential, logarithm, logarithms, log base, natural log, ln, power of,
squared, cubed, to the power, reciprocal, fraction, fractions, numerator, denominator, decimal, decimals,
percent, percentage, percentages, ratio, ratios, proportional, rate of change, average speed,
median, mode of, variance, standard deviation, expected value, random variable,
normal distribution, gaussian distribution, binomial distribution, poisson distribution,
uniform distribution, bernoulli, conditional probability, bayes theorem, bayes' theorem, independent events,
dice, die roll, coin toss, coin flip, flip a coin, roll a die, deck of cards, permutation, permutations,
combination, combinations, choose k, n choose k, factorial, factorials, fibonacci, sequences,
arithmetic sequence, geometric sequence, arithmetic progression, geometric progression, sum of, summation,
integral, integrals, integrate, integration, antiderivative, definite integral, indefinite integral,
derivative, derivatives, differentiate, differentiation, partial derivative, gradient, chain rule,
product rule, quotient rule, limit of, limits, l'hopital, l'hôpital, converge, converges, convergence,
diverge, divergence, taylor series, maclaurin series, fourier series, fourier transform, laplace transform,
infinity, infinite series, asymptote, asymptotes, continuity, continuous function, differentiable,
maximum value, minimum value, maxima, minima, extremum, optimization problem, local maximum, local minimum,
matrix, matrices, determinant, eigenvalue, eigenvalues, eigenvector, eigenvectors, inverse matrix,
transpose, vector space, vectors, dot product, cross product, linear transformation, rank of, basis vectors,
orthogonal, orthonormal, span of, kernel of, null space, linear independence, linearly independent,
primes, prime number, prime numbers, prime factorization, composite number, divisible, divisibility,
divisor, divisors, gcd, lcm, greatest common divisor, least common multiple, modulo, modular arithmetic,
quotient, congruent, congruence, integer, integers, natural number, natural numbers, rational number,
rational numbers, irrational, irrational number, real number, real numbers, complex number, complex numbers,
imaginary number, imaginary part, odd number, even number, parity, digits sum, sum of digits,
triangle, triangles, right triangle, hypotenuse, pythagorean, pythagoras, pythagorean theorem,
radian, radians, degrees angle, sine, cosine, tangent, arcsin, arccos, arctan,
circumference, radius, diameter, area of, perimeter, volume of, surface area, polygon, polygons,
rectangle, square of, parallelogram, trapezoid, rhombus, pentagon, hexagon, sphere, cylinder, cone, cube of,
prism, pyramid volume, coordinates, cartesian, polar coordinates, x-axis, y-axis, slope, intercept,
y-intercept, parabola, hyperbola, ellipse, conic section, vertex, midpoint, distance formula, unit circle,
theorem, theorems, lemma, corollary, proof, proofs, prove that, prove, proving, axiom, axioms, induction,
mathematical induction, contradiction proof, q.e.d., qed, iff, if and only if, subset, subsets, union of,
intersection of, empty set, cardinality, bijection, injective, surjective, function f, f(x), g(x), f'(x), dy/dx,
domain and range, inverse function, composite function, logic puzzle, how many ways, probability that,
calculate, calculating, calculation, compute the, evaluate the, minus, multiplied by, divided by,
multiply, multiplication, subtraction, sum, product of, difference of,
π, √, ∫, ∑, ∂, ≤, ≥, ≠, ±, ∞, θ, α, β, λ, σ, μ, x^2, x², ², ³, ½, math problem, word problem, homework math,
数学, 算术, 代数, 几何, 三角函数, 微积分, 概率, 概率论, 统计学, 数理统计, 线性代数, 高等数学, 高数, 数论, 离散数学, 组合数学, 拓扑,
方程, 方程组, 一元二次方程, 二元一次方程, 解方程, 不等式, 等式, 恒等式, 多项式, 因式分解, 系数, 未知数, 求解, 解得, 化简, 展开式,
立方, 平方根, 立方根, 开方, 根号, 对数, 次方, 倒数, 小数, 百分比, 百分数, 比值, 约分, 通分, 分母,
平均数, 平均值, 中位数, 众数, 方差, 标准差, 数学期望, 随机变量, 正态分布, 二项分布, 泊松分布, 均匀分布, 条件概率, 贝叶斯公式,
独立事件, 骰子, 掷骰子, 抛硬币, 排列, 排列组合, 组合数, 阶乘, 斐波那契, 数列, 等差数列, 等比数列, 级数, 求和, 通项公式, 前n项和,
定积分, 不定积分, 原函数, 导数, 求导, 偏导, 偏导数, 微分, 微分方程, 链式法则, 极限, 洛必达, 收敛, 发散, 泰勒展开, 泰勒级数,
傅里叶, 无穷大, 无穷小, 渐近线, 连续性, 可导, 极值, 极大值, 极小值, 最大值, 最小值, 最值, 单调性, 单调递增, 单调递减, 函数图像,
矩阵, 行列式, 特征值, 特征向量, 逆矩阵, 转置, 向量, 向量空间, 点积, 叉积, 内积, 线性变换, 线性无关, 线性相关, 基向量,
质数, 素数, 合数, 质因数, 分解质因数, 整除, 约数, 因数, 倍数, 公约数, 公倍数, 最大公约数, 最小公倍数, 余数, 取模, 同余,
整数, 正整数, 负数, 自然数, 有理数, 无理数, 实数, 复数, 虚数, 奇数, 偶数, 数位, 各位数字,
三角形, 直角三角形, 斜边, 勾股定理, 弧度, 正弦, 余弦, 正切, 圆周, 周长, 半径, 直径, 圆周率, 面积, 体积, 表面积,
多边形, 长方形, 正方形, 平行四边形, 梯形, 菱形, 球体, 圆柱, 圆锥, 立方体, 棱锥, 坐标, 坐标系, 直角坐标, 极坐标, x轴, y轴, 斜率, 截距,
抛物线, 双曲线, 椭圆, 圆锥曲线, 顶点坐标, 中点, 距离公式, 单位圆, 定理, 引理, 推论, 证明题, 求证, 公理, 数学归纳法, 反证法,
充分必要条件, 充要条件, 子集, 并集, 交集, 补集, 空集, 映射, 定义域, 值域, 反函数, 复合函数, 函数, 一次函数, 二次函数, 反比例函数,
计算, 算一下, 算算, 等于多少, 加法, 减法, 乘法, 除法, 乘以, 除以, 加上, 减去, 乘积, 之和, 之差, 几何题, 应用题, 数学题,
鸡兔同笼, 多少种, 几种方法, 概率是, 求值, 取值范围, 解析式, 函数值, 象限, 对称轴,
换算, 单位换算, 摄氏度, 华氏度, 英尺, 英寸, 盎司, 加仑, 英亩, 折上折, 打几折, 总折扣, unit conversion, convert units,
total discount, percent off, percentage off,
)";

// Translation: asking for one, and the languages.
constexpr std::string_view k_translation_head = R"(
translate, translates, translated, translating, translation, translations, translator, translators, translate into,
translate to, translate from, translate this, translate the following, please translate, can you translate,
how do you say, how to say, how would you say, how does one say, what is the word for,
what's the word for, literal translation, localize, localise, localization, localisation, interpreter for,
interpret this sentence, idiomatic, idiomatically,
pinyin, romaji, hiragana, katakana, kanji, hanzi, hangul, cyrillic, transliterate, transliteration, romanize,
翻译, 翻译成, 翻译为, 翻译一下, 帮我翻译, 请翻译, 译成, 译为, 译作, 翻成, 翻一下, 译文, 原文, 中译英, 英译中, 汉译英, 英译汉,
日译中, 中译日, 口译, 笔译, 同声传译, 直译, 意译, 信达雅, 怎么说, 如何说, 怎么讲, 怎么翻, 用英文, 用英语, 用中文, 用日语, 用日文,
用法语, 用德语, 用韩语, 用西班牙语, 说成, 表达成, 文言文, 白话文, 本地化, 地道的表达, 地道表达, 对应的词,
)";

// Everyday life, for a chat group: food and cooking, travel, health and
// fitness, shopping and consumer products, money in everyday use, family
// and relationships, work life and careers, writing requests,
// entertainment, pets, home, weather, history and culture, feelings, and
// the phrases that ask for advice. Left out: words as often a code prompt's
// ("game", 游戏, "cookie", "date", "sleep", "cat", "job", "resume",
// "health", "stress", "debt", "crypto", "speech", "relationship",
// "neighbor", "recommended", 工作, 对象) or a math word problem's ("buy",
// "price", "discount", "coupon", "loan", "interest", "invest", "train",
// "car", "kids", "son", "father", "fruit", "pizza", "cake", "shoes",
// "basketball", "series", "confidence", 运动, 行程, 水果, 衣服, 篮球, 爸爸,
// a city's name, units, temperatures). A gadget is a term ("laptop", 手机).
constexpr std::string_view k_chat = R"(
recipe, cook, cooking, cooked, bake, baking, baked, dinner, lunch, breakfast, brunch, meal, meals, meal prep, snack,
snacks, dessert, desserts, restaurant, restaurants, cafe, café, takeout, take-out, vegetarian, vegan, gluten-free,
pasta, spaghetti, burger, sandwich, salad, soup, curry, sushi, ramen, noodles, dumplings, fried rice, steak,
chicken breast, chicken wings, roast chicken, beef, pork, lamb, salmon, shrimp, tofu, vegetables, veggies, avocado,
garlic, onion, ginger, spices, seasoning, sauce, olive oil, butter, cheese, yogurt, scrambled eggs, omelette,
pancakes, bread, sourdough, flour, chocolate, cupcake, cheesecake, pie crust, ice cream, coffee, espresso, latte,
cappuccino, tea, green tea, milk tea, bubble tea, boba, smoothie, wine, beer, cocktail, whiskey, air fryer,
slow cooker, instant pot, oven, kitchen, leftovers, marinate, grilled, barbecue, bbq, picnic, tasty, delicious,
flavor, flavour, spicy, calorie, calories, nutrition, protein,
travel, traveling, travelling, traveler, trip, road trip, vacation, holiday, honeymoon, itinerary, flight, airline,
airport, layover, jet lag, hotel, hostel, airbnb, resort, passport, visa, tourist, sightseeing, backpacking, luggage,
suitcase, packing list, beach, mountains, hiking, camping, national park, cruise, museum, souvenir, bali, kyoto,
disneyland, japan trip, europe trip, 旅游, 旅行, 出游, 攻略, 旅游攻略, 景点, 机票, 酒店, 民宿, 签证, 护照, 自由行, 跟团,
度假, 行李, 自驾, 爬山, 露营, 海边, 好玩, 去哪玩, 去哪里玩, 出国, 留学, 高铁票, 火车票,
healthy, my health, health tips, mental health, health insurance, workout, gym membership, the gym, fitness, cardio,
push-ups, squats, yoga, pilates, stretching, jogging, marathon, running shoes, lose weight, weight loss,
losing weight, gain muscle, build muscle, diet, dieting, keto, intermittent fasting, vitamins, supplements, headache,
migraine, fever, cough, sore throat, flu, allergy, allergies, symptoms, doctor, dentist, hospital, medicine,
painkiller, ibuprofen, back pain, knee pain, injury, insomnia, can't sleep, cannot sleep, sleep better,
sleep schedule, nap, tired all the time, stressed, stressed out, anxiety, anxious, depression, depressed, therapist,
therapy, meditation, mindfulness, burnout, skincare, skin care, acne, sunscreen, hair loss, haircut, pregnancy,
pregnant, 健身, 健身房, 锻炼, 做运动, 跑步, 瑜伽, 减肥, 减脂, 增肌, 节食, 饮食, 健康, 养生, 热量, 卡路里, 蛋白质, 维生素, 头疼,
头痛, 感冒, 发烧, 咳嗽, 嗓子疼, 喉咙痛, 过敏, 症状, 看医生, 医生, 医院, 挂号, 体检, 吃药, 失眠, 睡不着, 熬夜, 睡眠, 焦虑, 抑郁,
压力大, 心理咨询, 护肤, 皮肤, 痘痘, 防晒, 脱发, 怀孕,
做饭, 菜谱, 食谱, 好吃, 美食, 餐厅, 外卖, 早餐, 午餐, 晚餐, 夜宵, 零食, 甜点, 面包, 烘焙, 咖啡, 奶茶, 火锅, 烧烤, 饺子, 包子,
面条, 米饭, 红烧肉, 番茄炒蛋, 西红柿炒鸡蛋, 炒菜,
shopping, online shopping, worth buying, worth it, want to buy, planning to buy, thinking of buying,
which one to buy, should i get, gift, gift ideas, birthday gift, christmas gift, present for, cheap, affordable,
budget-friendly, good value, refund, warranty, return policy, brand, amazon prime, laptop, gaming laptop, smartphone,
iphone, ipad, android phone, samsung, galaxy phone, pixel phone, xiaomi, huawei, oneplus, headphones, earbuds,
airpods, noise cancelling, noise-cancelling, bluetooth speaker, smartwatch, apple watch, fitbit, kindle,
digital camera, camera for, tv, television, phone battery, battery life, charger, phone case, sneakers, clothes,
clothing, outfit, dress, fashion, furniture, sofa, couch, mattress, vacuum cleaner, robot vacuum, dishwasher,
washing machine, fridge, refrigerator, air conditioner, electric car, used car, car insurance, ikea, nike, adidas,
购物, 网购, 买什么, 哪个好, 哪款, 性价比, 值得买, 值不值得, 推荐一款, 淘宝, 京东, 拼多多, 双十一, 快递, 退货, 退款, 礼物, 送礼,
生日礼物, 便宜, 太贵, 品牌, 手机, 苹果手机, 华为, 小米手机, 耳机, 蓝牙耳机, 笔记本电脑, 平板, 相机, 冰箱, 洗衣机, 空调,
扫地机器人, 充电器, 电池续航, 穿搭, 化妆品, 口红, 包包, 家具, 沙发, 床垫,
budget, budgeting, rent, salary, paycheck, payday, save money, saving money, emergency fund, retirement, pension,
401k, roth ira, credit card, credit card debt, pay off debt, in debt, credit score, student loans, mortgage rate,
taxes, tax return, insurance, investing, index fund, stock market, stocks, bitcoin, side hustle, afford,
cost of living, grocery list, grocery shopping, bills, utilities bill,
工资, 薪水, 月薪, 年薪, 房租, 租房, 买房, 房价, 房贷, 车贷, 存钱, 攒钱, 理财, 基金, 股票, 炒股, 信用卡, 花呗, 借钱, 还钱, 负债,
保险, 医保, 社保, 公积金, 退休, 养老, 预算, 开销, 生活费, 省钱, 个税, 副业, 红包, 彩礼,
boyfriend, girlfriend, husband, wife, spouse, fiance, fiancée, marriage, married, wedding, divorce, dating,
first date, dating app, tinder, crush, breakup, break up, broke up, ex-boyfriend, ex-girlfriend, my relationship,
in a relationship, relationship advice, best friend, my friend, my friends, friends with, friendship, family,
parents, mom, mum, dad, my mother, my father, my son, my daughter, my sister, my brother, grandma, grandpa,
grandparents, siblings, in-laws, mother-in-law, my kids, toddler, baby, newborn, parenting, teenager, roommate,
my neighbor, my neighbour, noisy neighbor, lonely, loneliness, anniversary, birthday, birthday party,
argument with, apologize, apologise, forgive,
男朋友, 女朋友, 男友, 女友, 老公, 老婆, 丈夫, 妻子, 恋爱, 谈恋爱, 表白, 暗恋, 分手, 前任, 复合, 吵架, 冷战, 结婚, 婚礼, 离婚,
相亲, 约会, 父母, 爸妈, 我妈, 我爸, 孩子, 宝宝, 小孩, 育儿, 带娃, 婆婆, 婆媳, 家人, 家庭, 亲戚, 朋友, 好朋友, 闺蜜, 兄弟, 室友,
邻居, 孤独, 生日, 纪念日, 过年, 春节,
job interview, interview tips, interviewer, my resume, update my resume, write a resume, resume tips, cover letter,
job offer, job search, job hunting, my job, new job, quit my job, quitting my job, career, career change, promotion,
pay raise, ask for a raise, my boss, boss, coworker, co-worker, colleague, resign, resignation letter, layoff,
laid off, linkedin, internship, intern, work-life balance, remote work, work from home, overtime, commute,
networking event, salary negotiation, negotiate salary, performance review, college application, personal statement,
graduate school, grad school, university, college, major in, scholarship, gap year, exam stress,
找工作, 换工作, 我的工作, 工作压力, 工作经验, 辞职, 离职, 跳槽, 裁员, 简历, 面试, 求职, 应聘, 职业, 职业规划, 老板, 领导, 上司,
同事, 加班, 升职, 加薪, 实习, 实习生, 毕业, 毕业生, 考研, 考公, 公务员, 大学, 选专业, 志愿, 高考, 留学申请, 上班, 通勤, 996,
write an email, write a email, email to my, an email to, reply to my, thank-you note, thank you note,
thank-you letter, cover letter for, love letter, letter to my, poem, poetry, haiku, sonnet, limerick, short story,
bedtime story, story about, a story, fairy tale, essay about, essay on, a speech, give a speech, speech for,
wedding speech, toast for, toast at, eulogy, lyrics, song lyrics, rap, blog post, instagram caption, caption for,
slogan, birthday message, birthday wish, greeting card, invitation,
作文, 写一篇, 写一首, 写一封, 一封信, 写邮件, 一封邮件, 诗歌, 古诗, 诗词, 现代诗, 藏头诗, 对联, 春联, 演讲, 演讲稿, 发言稿,
祝福语, 生日祝福, 文案, 朋友圈文案, 故事, 讲个故事, 童话, 小说, 散文, 读后感, 观后感, 心得体会, 情书, 自我介绍,
写个 email, 写封 email, 写一封 email, 封邮件, 写个邮件, 回复邮件, 邮件回复, 语气, 话术, 措辞, 致辞, 致词, 主持词, 开场白,
年会, 团建, 年终总结, 工作总结, 述职, 述职报告, 周报, 月报, 写一份通知, 写一个通知, 写个通知, 一份通知, 邀请函, 感谢信,
道歉信, 请假条, 个人简介, 差评, 好评, okr, okrs, self review, self-review, job description, proofread, proofreading,
rewrite this, reword this, rephrase this, polish this, sound more professional, more professional, more polite,
more formal, less formal,
movie, movies, film, cinema, tv show, tv series, netflix, hbo, disney, marvel, anime, manga, cartoon, documentary,
sitcom, actor, actress, director of, oscars, book, books, novel, author of, reading list, audiobook, bestseller,
harry potter, music, song, album, band, concert, playlist, singer, guitar, piano lessons, spotify, podcast,
video game, board game, nintendo, playstation, xbox, zelda, minecraft, olympics, world cup, nba, hobby, hobbies,
knitting, painting, photography,
电影, 电视剧, 综艺, 追剧, 动漫, 动画片, 漫画, 纪录片, 演员, 导演, 看书, 读书, 书单, 好书, 音乐, 歌曲, 听歌, 歌手, 乐队, 演唱会,
吉他, 钢琴, 玩游戏, 打游戏, 手游, 原神, 王者荣耀, 世界杯, 奥运会, 爱好, 兴趣爱好, 摄影, 画画,
dog, puppy, puppies, kitten, my cat, cats, pet, vet, veterinarian, dog food, cat food, litter box, hamster, parrot,
goldfish, aquarium, rabbit, 宠物, 猫咪, 狗狗, 养猫, 养狗, 小猫, 小狗, 猫粮, 狗粮, 铲屎, 兽医,
apartment, my house, home decor, decorating, interior design, garden, gardening, houseplant, plants, flowers,
laundry, house cleaning, clean my, chores, housework, declutter, organize my, mold, plumber, leaky faucet,
renovation, moving house, moving out, landlord, tenant,
装修, 搬家, 打扫, 大扫除, 收纳, 家务, 阳台, 养花, 绿植, 房东,
weather, weather forecast, rain, raining, rainy, snow, snowing, sunny, umbrella, heat wave, humid, humidity, winter,
summer, spring break, autumn, 天气, 天气预报, 下雨, 下雪, 带伞, 穿什么, 冬天, 夏天, 春天, 秋天,
history, historical, ancient, empire, dynasty, medieval, renaissance, world war, civil war, cold war, revolution,
napoleon, roman empire, ancient egypt, pyramids, greek mythology, mythology, culture, cultural, tradition, customs,
festival, christmas, thanksgiving, halloween, easter, ramadan, chinese new year, religion, buddhism, philosophy,
philosopher, art history, painting by,
历史, 古代, 朝代, 王朝, 皇帝, 秦始皇, 汉朝, 唐朝, 宋朝, 元朝, 明朝, 清朝, 三国, 战国, 二战, 抗战, 文化, 传统, 传统文化, 风俗, 习俗,
节日, 中秋节, 端午节, 元宵节, 清明节, 国庆, 哲学, 宗教, 佛教, 神话, 孔子, 李白, 红楼梦, 西游记, 三国演义, 水浒传,
should i, should we, would you recommend, recommend, recommendation, any suggestions, suggestions for, any tips,
tips for, tips on, advice, advise me, what do you think, is it okay to, is it ok to, is it normal, is it worth,
how can i stop, how do i deal with, how to deal with, how do i tell, how to tell my, feel like, i feel,
i'm feeling, feeling sad, sad, happy, upset, bored, nervous, excited, motivation, motivated, procrastinate,
procrastination, self-esteem, life advice, weekend, this weekend, tonight, tomorrow,
推荐, 求推荐, 推荐一下, 有什么推荐, 建议, 有什么建议, 怎么办, 该怎么办, 怎么选, 如何选择, 要不要, 该不该, 好不好, 值得吗, 你觉得,
你认为, 心情, 难过, 伤心, 开心, 无聊, 紧张, 迷茫, 烦恼, 郁闷, 累了, 好累, 周末, 假期, 放假, 今晚, 明天,
)";

}  // namespace

// Languages: asked for as "into / to / from LANGUAGE", "LANGUAGE
// translation", "the LANGUAGE word for" and so on; a language named alone
// is as often a chat's subject ("French history"), and so is "in LANGUAGE"
// ("in English class"): neither is a term.
namespace {

constexpr std::string_view k_languages[] = {
    "english", "chinese", "mandarin", "cantonese", "japanese", "korean", "french", "spanish", "german",
    "italian", "portuguese", "brazilian portuguese", "russian", "arabic", "hindi", "bengali", "urdu", "punjabi",
    "vietnamese", "thai", "indonesian", "malay", "tagalog", "filipino", "turkish", "persian", "farsi", "hebrew",
    "greek", "latin", "dutch", "swedish", "norwegian", "danish", "finnish", "icelandic", "polish", "czech",
    "slovak", "hungarian", "romanian", "bulgarian", "ukrainian", "serbian", "croatian", "swahili", "esperanto",
    "simplified chinese", "traditional chinese"};
constexpr std::string_view k_language_before[] = {"into", "to", "from"};

// Units: asked for as "to / into / in UNIT" ("72 kg to pounds", "5 cups of
// flour in grams"), a conversion; a unit named alone is as often a chat's
// ("a 5 km run"), and so are the ones that are everyday words or other
// things' names ("bar", "stone", "cups", "g", "knots"; "ml" is machine
// learning, "oz" Australia).
constexpr std::string_view k_units[] = {
    "celsius", "fahrenheit", "kelvin", "kg", "kgs", "kilograms", "kilos", "grams", "pounds", "lbs", "lb", "ounces",
    "km", "kilometers", "kilometres", "miles", "meters", "metres", "feet", "ft", "inches", "cm", "centimeters",
    "centimetres", "mm", "millimeters", "yards", "liters", "litres", "gallons", "milliliters", "quarts", "pints",
    "fluid ounces", "psi", "kpa", "pascals", "mph", "km/h", "kph", "acres", "hectares", "square feet",
    "square meters", "sq ft", "btu", "joules", "kwh", "watts", "horsepower", "nautical miles", "light years"};
constexpr std::string_view k_unit_before[] = {"into", "to", "in"};
constexpr std::string_view k_language_after[] = {"translation", "version", "equivalent", "word", "words", "phrase",
                                                 "sentence", "text", "subtitles"};

}  // namespace

std::array<std::string, k_topics> builtin_topic_terms() {
  std::string translation(k_translation_head);
  for (std::string_view l : k_languages) {
    for (std::string_view b : k_language_before) translation.append(b).append(" ").append(l).append(",");
    for (std::string_view a : k_language_after) translation.append(l).append(" ").append(a).append(",");
  }
  std::string math(k_math);
  for (std::string_view u : k_units) {
    for (std::string_view b : k_unit_before) math.append(b).append(" ").append(u).append(",");
  }
  return {std::string(k_code), std::move(math), std::move(translation), std::string(k_chat)};
}

}  // namespace sluice::config
